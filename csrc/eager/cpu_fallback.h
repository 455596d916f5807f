#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace torch_pjrt::eager {

// Runs `op` on the CPU (inputs copied to the host, results and mutated
// arguments copied back), or raises NotImplementedError with
// TORCH_PJRT_FALLBACK=error. (Counts: executor.h cpu_fallback_counts.)
// `dtype_limited`: the op has a lowering, but not for these dtypes (the
// first-time warning says so).
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool dtype_limited = false);

// What run_on_cpu does before running: the device check, the
// TORCH_PJRT_FALLBACK=error refusal, the count and the first-time warning
// (for fallbacks that copy arguments themselves: device/nested.cpp).
// Reads TORCH_PJRT_FALLBACK now (the import), so a bad value fails there, not at a first fallback.
void read_fallback_setting();
void enter_cpu_fallback(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool dtype_limited = false);

// Raises PyTorch's device-mismatch error when an argument of `op` is not on
// the device of its tpu arguments: any it writes (out=, in-place self), and
// any it reads but a 0-d CPU tensor (a scalar) or a packed sequence's host
// lengths (run_on_cpu checks this first).
void check_fallback_devices(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args);

}  // namespace torch_pjrt::eager
