// Checks PyTorch makes in its CPU kernels but not in its Meta kernels: a dtype
// an op does not implement ("abs_cpu" not implemented for 'Bool'), an out=
// dtype it refuses, a Python scalar that does not fit the dtype the kernel
// converts it to (c10::checked_convert). The executor's Meta pass cannot see
// them, so when a plan is built for a new signature (once per cache key) the
// CPU kernel itself is asked, on CPU tensors of the same dtypes, and its
// exception is raised with its type. Float arguments that are runtime inputs
// (one program for every value) get a per-call range check instead.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

#include "eager/op_instance.h"

namespace torch_pjrt::eager {

// One runtime float argument that CPU's kernel converts with checked_convert.
struct ScalarCheck {
  int scalar;             // index into OpInstance::scalars
  c10::ScalarType type;   // what the kernel converts it to
  const char* type_name;  // as CPU's message names it ("int8_t", "c10::Half")
};

// The dtypes of the tpu tensors among `args`, for messages ("Float, Long").
std::string dtypes_of(c10::ArrayRef<c10::IValue> args);

// Runs the op on CPU tensors of the call's dtypes and shapes (calls of at most
// 4096 elements; larger ones are not probed) with the call's other arguments;
// raises CPU's exception type (message naming the op, dtypes and device tpu)
// for a check only the CPU kernel makes. Nothing for random ops, views,
// autograd's backward ops, ops without a CPU kernel, and failures that come
// from the probe's own data.
// `meta`: the executor's Meta results for the call (their sizes).
void check_like_cpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool random,
                    const torch::jit::Stack& meta);
// Which runtime float arguments the CPU kernel converts with an overflow check
// (asked once per plan, with a value that fits no narrower dtype).
std::vector<ScalarCheck> learn_scalar_checks(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                             const OpInstance& inst, bool random, const torch::jit::Stack& meta);
// Whether CPU's kernel checks a runtime int's value for this plan (uint8
// hardtanh's negative limits, int8 fill_(200), sub's -alpha overflowing,
// i64 // 0): asked once per plan, with the call's ints changed to probe values
// on the call shrunk to 4 per dim (their own values must pass there). Such a
// plan then asks CPU again for every new set of int values (check_int_values),
// so CPU's error is raised at the op, as when each value had its own program.
bool learn_int_value_checks(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                            bool random);
// Per call, for such a plan: raises CPU's error for the call's int values
// (the call shrunk, as above); `accepted` remembers the last few value sets
// that passed, so a repeated one costs nothing.
void check_int_values(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                      std::vector<std::vector<int64_t>>& accepted, size_t& next);
// PyTorch's Meta kernel raised for this call: raises CPU's exception instead
// where CPU's kernel raises too (its type, e.g. NotImplementedError for a
// dtype); where CPU computes it (a Meta kernel's bug, e.g. bool ** True),
// CPU's results (as meta tensors) stand for the Meta results; else nullopt.
std::optional<torch::jit::Stack> meta_failed(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                             bool random);
// A complex out= of an op on real inputs (sqrt(x, out=c)): CPU computes in the
// functional op's (real) dtype and casts, so sqrt(-2) is nan+0j; the result
// types in `meta` become the real ones (the write to out= converts).
void real_compute_for_complex_out(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                  torch::jit::Stack& meta);
// Per call: raises CPU's RuntimeError for a value that does not fit.
void check_scalars(const std::vector<ScalarCheck>& checks, const OpInstance& inst, const std::string& op);

}  // namespace torch_pjrt::eager
