// The runtime's errors as PyTorch's exception types: out of memory as
// torch.OutOfMemoryError (users' OOM handlers catch it), failed index checks
// as IndexError, and so on.
#include <c10/util/Exception.h>

#include "runtime/errors.h"

namespace torch_pjrt::device {
namespace {

[[noreturn]] void raise_as_torch(runtime::ErrorKind kind, const std::string& message) {
  switch (kind) {
    case runtime::ErrorKind::OutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    case runtime::ErrorKind::Index:
      TORCH_CHECK_INDEX(false, message);
    case runtime::ErrorKind::Value:
      TORCH_CHECK_VALUE(false, message);
    case runtime::ErrorKind::LinAlg:
      TORCH_CHECK_LINALG(false, message);
    case runtime::ErrorKind::Runtime:
      break;
  }
  TORCH_CHECK(false, message);
}

struct InstallRaiser {
  InstallRaiser() { runtime::set_raiser(&raise_as_torch); }
} g_install_raiser;

}  // namespace
}  // namespace torch_pjrt::device
