#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace torch_pjrt::eager {

// Runs `op` on the CPU (inputs copied to the host, results and mutated
// arguments copied back), or raises NotImplementedError with
// TORCH_PJRT_FALLBACK=error. (Counts: executor.h cpu_fallback_counts.)
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_pjrt::eager
