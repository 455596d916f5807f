// Errors the runtime raises, by kind, so that the device layer can turn each
// into the exception PyTorch raises for it (torch.OutOfMemoryError,
// IndexError, ...). The runtime itself knows nothing of PyTorch: it calls the
// installed raiser, which by default throws std::runtime_error.
#pragma once

#include <string>

namespace torch_pjrt::runtime {

enum class ErrorKind { Runtime, OutOfMemory, Index, Value, LinAlg };

using Raiser = void (*)(ErrorKind kind, const std::string& message);
void set_raiser(Raiser raiser);
[[noreturn]] void raise(ErrorKind kind, const std::string& message);

// The op this thread is running (e.g. "aten::mul.Tensor"), named in
// out-of-memory errors; set for the scope of one op by the frontends.
class OpLabel {
 public:
  explicit OpLabel(const std::string& name);
  ~OpLabel();
  OpLabel(const OpLabel&) = delete;
  OpLabel& operator=(const OpLabel&) = delete;
  static const std::string* current();

 private:
  const std::string* previous_;
};

}  // namespace torch_pjrt::runtime
