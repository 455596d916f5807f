#include "runtime/errors.h"

#include <stdexcept>

namespace torch_pjrt::runtime {
namespace {

[[noreturn]] void default_raiser(ErrorKind, const std::string& message) {
  throw std::runtime_error(message);
}

Raiser g_raiser = &default_raiser;
thread_local const std::string* t_op_label = nullptr;

}  // namespace

void set_raiser(Raiser raiser) { g_raiser = raiser ? raiser : &default_raiser; }

void raise(ErrorKind kind, const std::string& message) {
  g_raiser(kind, message);
  throw std::runtime_error(message);  // a raiser that returned
}

OpLabel::OpLabel(const std::string& name) : previous_(t_op_label) { t_op_label = &name; }
OpLabel::~OpLabel() { t_op_label = previous_; }
const std::string* OpLabel::current() { return t_op_label; }

}  // namespace torch_pjrt::runtime
