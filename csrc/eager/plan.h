// The compiled plan of one op instance: where each program parameter comes
// from, what each return is, which storages the outputs replace. Built once per
// cache key (plan_build.cpp), run on every call (plan_run.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/FunctionRef.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "eager/cpu_check.h"
#include "eager/op_instance.h"
#include "lowering/registry.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {

struct ReturnPlan {
  enum Kind { Fresh, Aliased, HostScalar, Constant, Undefined } kind = Fresh;
  c10::IValue constant;          // Constant: the value itself
  int slot = -1;                 // Aliased: which slot's tensor is returned
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
  int output = -1;               // program output index (Fresh, HostScalar)
  c10::TypePtr type;             // HostScalar: the schema return type
};

struct Write {
  int storage;  // which storage receives program output `output`
  int output;
  lowering::DType dtype;
};

struct Resize {
  int slot;
  std::vector<int64_t> sizes;
};

// Where each program parameter comes from at run time.
struct ParamSource {
  // Offsets: the storage offset of every slot, an s64 vector (views read and
  // write their storage with dynamic_slice / dynamic_update_slice at it).
  enum Kind : char { Storage, Rng, Scalars, CheckWord, Offsets } kind;
  int storage = -1;
  lowering::DType dtype = lowering::DType::F32;
};

struct Plan {
  runtime::ExecutablePtr exe;
  std::string text;  // kept: fused eager composes traces from op programs
  uint64_t serial = 0;  // unique per plan: what a fused trace's structure names
  std::string op_name;  // "aten::mul.Tensor", for errors
  std::vector<lowering::TensorType> param_types, output_types;
  std::vector<ParamSource> params;
  bool dynamic_floats = false;  // float arguments are in the scalar input
  std::vector<ReturnPlan> returns;
  int64_t fresh_bytes = 0;  // what the Fresh returns take (fused eager's fit check)
  std::vector<int> return_arity;  // per schema return: -1 one value, n: a list of n
  std::vector<Write> writes;
  std::vector<Resize> resizes;
  bool read_scalar_value = false;  // the lowering used a runtime scalar's value
  bool f32_precision = false;      // a float32 dot or convolution took torch's matmul precision
  int check_output = -1;  // the updated check word (value checks), when the op has checks
  // Runtime float arguments CPU's kernel converts with an overflow check:
  // checked on every call (cpu_check.h).
  std::vector<ScalarCheck> scalar_checks;
  // Runtime ints whose values CPU's kernel checks (learn_int_value_checks):
  // each new set of values is asked of CPU (check_int_values); the last few
  // accepted ones are remembered. Read and written under the device lock.
  bool int_value_checks = false;
  std::vector<std::vector<int64_t>> accepted_ints;
  size_t accepted_next = 0;
  // Validated float mode: float argument values the Meta kernel has accepted
  // for this plan (bit patterns; a few, most recent replacing the oldest), so
  // a call repeating them (normal_(0, 1) each step) skips the Meta run. Read
  // and written under the device lock.
  std::vector<std::vector<uint64_t>> validated_floats;
  size_t validated_next = 0;
  std::vector<std::string> warnings;  // the lowering's (LoweringContext::warn), given per call
  std::vector<std::string> warnings_once;  // (LoweringContext::warn_once), once per process
};

// PyTorch's Meta kernel on meta copies of the arguments (shapes, dtypes,
// PyTorch's own errors); out= tensors are resized, recorded in `resizes`
// (only recorded when `dry`).
torch::jit::Stack run_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                           OpInstance& inst, std::vector<Resize>* resizes, bool dry = false);
// Fresh Meta results restrided to the memory format CPU's kernel gives them
// where the Meta kernel does not (channels_last through convolution and the
// reflection/replication pads; output_layout.cpp).
void keep_cpu_memory_format(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                            torch::jit::Stack& meta_returns);
// The program (text, not compiled) of one op instance; `dynamic_floats`:
// float arguments are runtime inputs.
std::shared_ptr<Plan> lower(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                            OpInstance& inst, const lowering::LoweringInfo& info,
                            const std::string& base, const std::string& overload,
                            const torch::jit::Stack& meta_stack, bool dynamic_floats);
// Host-side inputs of one call: runtime scalars, slot storage offsets, the
// random key (when the program takes them).
c10::SmallVector<double, 8> scalar_values(const Plan& plan, const OpInstance& inst);
c10::SmallVector<int64_t, 8> offset_values(const OpInstance& inst);
std::pair<int64_t, int64_t> rng_values(c10::ArrayRef<c10::IValue> args, int device);
// Device vectors of runtime scalars (scalar_pack_dtype) and of s64 values
// (offsets, random keys): what strict and fused launches pass. `internal`:
// the caller caches the buffer (runtime::constant_buffer).
runtime::BufferPtr scalar_pack_buffer(const double* v, int64_t n, int device, bool internal = false);
runtime::BufferPtr s64_buffer(const int64_t* v, int64_t n, int device, bool internal = false);
// The result of one schema return from the plan; `fresh` makes Fresh ones.
c10::IValue make_return(const ReturnPlan& rp, const OpInstance& inst,
                        c10::function_ref<c10::IValue(const ReturnPlan&)> fresh);
// Pushes the op's returns (per return_arity) onto the stack.
void push_returns(const Plan& plan, const OpInstance& inst, torch::jit::Stack* stack,
                  c10::function_ref<c10::IValue(const ReturnPlan&)> make);
// Launches the plan's program and replaces the op's arguments by its results.
void run_plan(const Plan& plan, const c10::FunctionSchema& schema, OpInstance& inst,
              c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack, size_t nargs);

bool debug_mode();      // TORCH_PJRT_EAGER=debug
bool checks_enabled();  // TORCH_PJRT_CHECKS=on (default) | off, or set_checks_enabled
void set_checks_enabled(bool on);  // programs built from now on (part of every key)
// Registers a lowering's value check of `op` with the runtime: its code in the check word.
int register_check(const std::string& op, const lowering::LoweringContext::Check& c);
// _foreach_ ops run their element op per list index; these argument names of
// the foreach op are also passed under the element op's names.
const std::vector<std::pair<std::string, std::vector<std::string>>>& foreach_aliases();
lowering::DType scalar_pack_dtype();
// A new Plan::serial (unique in the process).
uint64_t next_plan_serial();

}  // namespace torch_pjrt::eager
