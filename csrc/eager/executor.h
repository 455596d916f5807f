// The eager frontend: every ATen op on tpu tensors that has no dedicated
// kernel lands in `lowering_fallback`, which builds (or finds in its cache) a
// one-op StableHLO program from the lowering registry and launches it
// asynchronously. Only host reads wait.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lowering/builder.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {

void lowering_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// How often each op without a lowering ran on the CPU, by op name.
std::map<std::string, int64_t> cpu_fallback_counts();

// The tensor's elements, dense and row-major, in its own dtype (runs a small
// program when the tensor is a strided view).
runtime::BufferPtr materialize(const at::Tensor& t);
// Writes a dense row-major buffer of `t`'s dtype and shape into t's view.
void assign(const at::Tensor& t, runtime::BufferPtr values);

// Builds and runs a cached program outside the op registry (view reads and
// writes). `build` adds parameters in the order of `inputs`.
std::vector<runtime::BufferPtr> run_cached(
    const std::string& key, const std::vector<runtime::BufferPtr>& inputs, int device,
    const std::function<std::vector<lowering::Value>(lowering::Builder&)>& build);

// Compiles a program (TORCH_PJRT_DUMP prints it; record_programs keeps it).
runtime::ExecutablePtr compile_program(const std::string& text, const std::string& what);
// What compile_program does first: TORCH_PJRT_DUMP and record_programs see it.
void note_compiled_program(const std::string& text, const std::string& what);

int64_t executable_cache_size();
// How each op's float arguments are treated, learned at its first build:
// "runtime" (program inputs), "validated" (inputs, checked by the Meta kernel
// on every call) or "by value" (part of the cache key).
std::map<std::string, std::string> float_modes();
void clear_executable_cache();
// While on, every eager program compiled is kept as (op, StableHLO text);
// take_recorded_programs() hands them over (and forgets them). Returns the
// previous setting.
bool record_programs(bool on);
std::vector<std::pair<std::string, std::string>> take_recorded_programs();

}  // namespace torch_pjrt::eager
