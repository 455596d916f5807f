// Ops without a lowering run on the CPU (PyTorch's cpu_fallback), warn once,
// and are counted; TORCH_PJRT_FALLBACK=error makes them NotImplementedError.
#include "eager/cpu_fallback.h"

#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>

#include <mutex>

#include "eager/env.h"
#include "eager/op_instance.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {
namespace {

std::mutex g_fallback_mutex;
std::map<std::string, int64_t> g_fallback_counts;

bool fallback_is_error() {
  static bool error = env_choice("TORCH_PJRT_FALLBACK", "cpu", {"cpu", "error"}) == "error";
  return error;
}

}  // namespace

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string name = op_display_name(op.schema());
  TORCH_CHECK_NOT_IMPLEMENTED(!fallback_is_error(), "torch_pjrt: ", name,
                              " has no lowering for device tpu (plugin '", runtime::Runtime::get().info().name,
                              "') and TORCH_PJRT_FALLBACK=error forbids running it on CPU; "
                              "see torch_pjrt.supported_ops()");
  bool first;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mutex);
    first = g_fallback_counts[name]++ == 0;
  }
  if (first)
    TORCH_WARN("torch_pjrt: ", name, " has no lowering for device tpu; it runs on the CPU "
               "(inputs copied to the host and results back). Counted in "
               "torch_pjrt.metrics()['cpu_fallbacks'].");
  at::native::cpu_fallback(op, stack);
}


std::map<std::string, int64_t> cpu_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return g_fallback_counts;
}

}  // namespace torch_pjrt::eager
