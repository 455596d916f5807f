#include "eager/executor.h"

#include <ATen/TracerMode.h>
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "device/device_lock.h"
#include "device/dtype_map.h"
#include "device/matmul_precision.h"
#include "device/generator.h"
#include "device/storage.h"
#include "eager/cpu_fallback.h"
#include "eager/fused.h"
#include "eager/plan.h"
#include "lowering/registry.h"
#include "lowering/strided_access.h"
#include "runtime/constant_buffers.h"
#include "runtime/program_cache.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::Builder;
using lowering::DType;
using lowering::StridedView;
using lowering::TensorType;
using lowering::Value;

namespace {

bool dump_programs() {
  static bool dump = [] {
    const char* v = std::getenv("TORCH_PJRT_DUMP");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return dump;
}

runtime::Runtime& rt() { return runtime::Runtime::get(); }

// ---- key encoding: raw bytes appended to a string ---------------------------------------

void put(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put(std::string& k, char c) { k.push_back(c); }
void put(std::string& k, c10::IntArrayRef a) {
  put(k, static_cast<int64_t>(a.size()));
  for (auto v : a) put(k, v);
}

runtime::ProgramCache& cache() { return runtime::ProgramCache::get(); }

std::shared_ptr<Plan> cache_find(std::string_view key) {
  return std::static_pointer_cast<Plan>(cache().find(key));
}

// What an entry weighs in the cache's byte bound: the plugin's generated
// code size, and at least a fixed estimate of what an executable costs beyond
// its code (the CPU plugin reports code only).
constexpr int64_t kMinEntryBytes = 64 << 10;

void cache_put(const std::string& key, std::shared_ptr<Plan> plan) {
  int64_t bytes = std::max<int64_t>(plan->exe ? plan->exe->code_bytes() : 0, kMinEntryBytes);
  cache().put(key, std::move(plan), bytes);
}

// Per op overload: may float arguments be runtime inputs? Learned from the
// first build with floats (learn_float_mode).
// Validated: runtime inputs, but some values are invalid (PyTorch's Meta
// kernel rejects them, e.g. uniform_'s from > to), so every call runs the
// Meta kernel first, as CPU would check.
enum class FloatMode : char { Unknown, Dynamic, Validated, Static };
std::mutex g_mode_mutex;
std::unordered_map<std::string, FloatMode> g_float_mode;

FloatMode float_mode(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_mode_mutex);
  auto it = g_float_mode.find(op);
  return it == g_float_mode.end() ? FloatMode::Unknown : it->second;
}

void set_float_mode(const std::string& op, FloatMode m) {
  std::lock_guard<std::mutex> lock(g_mode_mutex);
  g_float_mode[op] = m;
}

// Programs compiled while recording (the readiness check compiles eager op
// programs for a TPU topology from these).
std::mutex g_record_mutex;
bool g_recording = false;
std::vector<std::pair<std::string, std::string>> g_recorded;

// A lowering's once-per-process warnings (CPU's TORCH_WARN_ONCE).
void warn_once(const std::vector<std::string>& messages) {
  static std::mutex mutex;
  static std::set<std::string> given;
  for (const std::string& m : messages) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!given.insert(m).second) continue;
    }
    TORCH_WARN(m);
  }
}

}  // namespace

// TORCH_PJRT_DUMP and record_programs see every program compiled.
void note_compiled_program(const std::string& text, const std::string& what) {
  if (dump_programs()) std::cerr << "[torch_pjrt] program for " << what << ":\n" << text;
  std::lock_guard<std::mutex> lock(g_record_mutex);
  if (g_recording) g_recorded.emplace_back(what, text);
}

runtime::ExecutablePtr compile_program(const std::string& text, const std::string& what) {
  note_compiled_program(text, what);
  return rt().compile(text);
}

namespace {

// An op plan's program: on a compile thread (compile_pool.cpp) where its
// launch waits for it in the launch queue. In debug mode, or with launches
// made on the caller, it compiles here (an error then names the op at once).
// An error compiling on a thread reaches the op's outputs, raised where they
// are read (as a failed launch's), naming the op.
runtime::ExecutablePtr compile_plan(const Plan& plan, const std::string& what) {
  if (debug_mode() || !runtime::async_launch_enabled()) return compile_program(plan.text, what);
  note_compiled_program(plan.text, what);
  std::vector<int64_t> bytes;
  bytes.reserve(plan.output_types.size());
  for (const lowering::TensorType& t : plan.output_types) bytes.push_back(t.numel() * lowering::itemsize(t.dtype));
  return rt().compile_async(plan.text, std::move(bytes), what);
}

std::string strip_namespace(const std::string& name) {
  auto pos = name.find("::");
  return pos == std::string::npos ? name : name.substr(pos + 2);
}

// Values a float argument is probed with: far up and far down (a shape
// computed from it, like arange's length, changes), and a nudge (stays valid
// where the far ones are rejected, e.g. bernoulli's p).
std::vector<double> probe_values(double v) {
  double far = 1.75 * std::max(1.0, std::fabs(v)) + 0.5;
  return {v + far, v - far, v + 0.01 * std::max(1.0, std::fabs(v))};
}

// The same for an int Scalar argument: integers far up, far down and next to
// it, each a runtime int too (not the schema default).
int64_t int_probe_value(const c10::Argument& a, int64_t v, int probe) {
  int64_t far = 2 * std::max<int64_t>(1, v < 0 ? -v : v) + 1;
  int64_t p = probe == 0 ? v + far : probe == 1 ? v - far : v + 1;
  if (!exact_in_pack(p)) p = v / 2 + (probe == 0 ? 1 : probe == 1 ? -1 : 3);  // (v near the pack's limit)
  if (!runtime_int_arg(a, p)) p += 7;  // the schema default (a constant): a value near it
  return p;
}

// Whether every float argument of this call may be a runtime input: the
// program (text and out= sizes) must not change when one of them does. The
// general rule behind "keyed by value": a lowering that reads a float's value
// at build time, or a Meta kernel whose output shapes depend on it (arange's
// end), gives another program for another value. Each argument is probed with
// other values; one that changes the program, or that no probe value is
// valid for, makes the op keyed by value (Static); one with some rejected
// values makes it Validated.
FloatMode learn_float_mode(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                           const lowering::LoweringInfo& info, const std::string& base, const std::string& overload,
                           const Plan& plan) {
  if (plan.read_scalar_value) return FloatMode::Static;
  bool any_rejected = false;
  // The probes' own warnings (e.g. resizing an out= tensor) are not the user's.
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } quiet;
  c10::WarningUtils::WarningHandlerGuard quiet_guard(&quiet);
  // The program for `changed` arguments: nullopt when they are rejected.
  auto same_program = [&](const std::vector<c10::IValue>& changed) -> std::optional<bool> {
    try {
      OpInstance other;
      other.foreach = inst.foreach;
      describe(other, op.schema(), changed);
      // out= tensors are already resized for this call's values: another
      // size for the changed ones shows as a resize.
      std::vector<Resize> other_resizes;
      torch::jit::Stack meta = run_meta(op, changed, other, &other_resizes, /*dry=*/true);
      if (!other_resizes.empty()) return false;
      auto other_plan = lower(op, changed, other, info, base, overload, meta, true);
      return !other_plan->read_scalar_value && other_plan->text == plan.text;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const auto& sargs = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    bool is_double = args[i].isDouble();
    bool is_int = args[i].isInt() && runtime_int_arg(sargs[i], args[i].toInt());
    bool is_list = inst.foreach && is_scalar_list(args[i]);
    if (!is_double && !is_int && !is_list) continue;
    bool any_valid = false;
    for (int probe = 0; probe < 3; ++probe) {
      std::vector<c10::IValue> changed(args.begin(), args.end());
      if (is_double) {
        changed[i] = probe_values(args[i].toDouble())[probe];
      } else if (is_int) {
        changed[i] = int_probe_value(sargs[i], args[i].toInt(), probe);
      } else {
        c10::impl::GenericList list = args[i].toList().copy();  // keeps the element type
        for (size_t k = 0; k < list.size(); ++k)
          if (list.get(k).isDouble()) list.set(k, probe_values(list.get(k).toDouble())[probe]);
        changed[i] = list;
      }
      std::optional<bool> same = same_program(changed);
      if (same && !*same) return FloatMode::Static;
      any_valid |= same.has_value();
      any_rejected |= !same.has_value();
    }
    if (!any_valid) return FloatMode::Static;
  }
  return any_rejected ? FloatMode::Validated : FloatMode::Dynamic;
}

// Whether the call has scalar arguments (floats, or int Scalars), and
// whether one of them is an int: one pass per call.
struct ScalarArgs {
  bool any = false, ints = false;
};
ScalarArgs scalar_args(const OpInstance& inst) {
  ScalarArgs r;
  for (const auto& s : inst.scalars) {
    r.any |= s.from_arg;
    r.ints |= s.from_arg && s.is_int;
  }
  return r;
}

// Ints the plan takes at run time: wrapped integer tensors always, int
// Scalar arguments in dynamic mode.
bool has_runtime_ints(const OpInstance& inst, bool dynamic) {
  for (const auto& s : inst.scalars)
    if (s.is_int && (!s.from_arg || dynamic)) return true;
  return false;
}


// complex and uint16/32/64 reach a lowering only for the ops below, whose
// lowerings handle them (checked against CPU in tests/test_complex.py and
// tests/test_unsigned.py); every other op on them runs on the CPU, which also
// raises CPU's own errors (NotImplementedError for most ops on uint16/32/64).
bool lowering_handles_dtypes(const std::string& base, c10::ArrayRef<c10::IValue> stack_args,
                             const c10::FunctionSchema& schema) {
  static const std::set<std::string> unsigned_ops = {
      "bitwise_and", "bitwise_or", "bitwise_xor", "eq", "ne", "fill", "zero", "clone", "_to_copy", "copy",
      "cat", "mul", "sum"};
  static const std::set<std::string> complex_ops = {
      "add", "sub", "rsub", "mul", "div", "neg", "exp", "sqrt", "fill", "zero", "clone", "_to_copy", "copy",
      "cat", "mm", "bmm", "dot", "sum", "mean", "abs", "angle", "eq", "ne", "conj_physical", "reciprocal",
      "_conj_physical", "_fft_c2c", "_fft_r2c", "_fft_c2r", "where", "complex", "sgn", "mv", "addmm", "addmv",
      "baddbmm", "addbmm", "vdot", "polar", "constant_pad_nd", "roll", "flip", "index_select",
      // StableHLO's elementwise ops take complex operands as they are (forward only:
      // their backward ops are not listed, the CPU computes them with the conj).
      "log", "log1p", "expm1", "cos", "sin", "tan", "tanh", "cosh", "sinh", "rsqrt", "cumsum", "nan_to_num",
      "isnan", "isinf", "all", "any", "count_nonzero", "masked_fill", "prod", "normal",
      // |z| rounded as CPU (complex_abs.cpp), then the real norm
      "linalg_vector_norm", "norm",
      // data movement and exact complex arithmetic
      "index", "_unsafe_index", "index_put", "_index_put_impl", "gather", "scatter", "take", "tril", "triu", "trace",
      "addcmul", "lerp", "pow",
      // checked against CPU in tests/test_complex.py (complex_math.cpp: CPU's formulas where XLA's differ)
      "index_add", "index_copy", "index_fill", "scatter_add", "masked_scatter", "put", "nonzero_static",
      "_unsafe_index_put", "eye", "channel_shuffle", "im2col", "col2im", "reflection_pad1d", "reflection_pad2d",
      "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d", "logical_and",
      "logical_or", "logical_xor", "logical_not", "cumprod", "addcdiv", "linspace", "logspace", "std", "var",
      "std_mean", "var_mean", "sigmoid", "silu", "exp2", "log2", "log10", "sinc", "acos", "asin", "atan", "acosh",
      "asinh", "atanh", "logaddexp", "linalg_cross", "renorm"};
  // float8: conversions and data movement; CPU's kernels do the rest (and
  // raise CPU's NotImplementedError where it has no float8 kernel).
  static const std::set<std::string> float8_ops = {
      "fill", "zero", "clone", "_to_copy", "copy", "cat", "eq", "ne", "isnan", "where", "index_select", "index",
      "_unsafe_index", "index_put", "_index_put_impl", "flip", "roll", "constant_pad_nd", "_scaled_mm", "_scaled_mm_v2"};
  bool has_unsigned = false, has_complex = false, has_float8 = false;
  auto note = [&](c10::ScalarType t) {
    has_float8 |= c10::isFloat8Type(t);
    has_unsigned |= t == c10::kUInt16 || t == c10::kUInt32 || t == c10::kUInt64;
    has_complex |= t == c10::kComplexFloat || t == c10::kComplexDouble || t == c10::kComplexHalf;
  };
  // Complex CPU scalars (a Python complex, wrapped or as a Scalar argument;
  // a 0-d CPU tensor) are runtime inputs of the complex ops above; as a
  // Scalar argument only where the lowering reads it as an operand.
  static const std::set<std::string> complex_scalar_arg_ops = {
      "fill", "masked_fill", "mul", "div", "add", "sub", "rsub", "eq", "ne", "where", "index_fill"};
  bool complex_cpu_scalar = false;
  // A uint64 CPU scalar (a 0-d tensor, or a Python int in [2**63, 2**64)) sets
  // the result dtype only where no tpu tensor is of a non-bool dtype (x * 2**63
  // is float32 for a float32 x): only then does it count as unsigned here.
  bool unsigned_cpu_scalar = false, non_bool_tensor = false;
  auto note_tensor = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (!t.is_privateuseone() && t.dim() == 0 && t.scalar_type() == c10::kUInt64) {
      unsigned_cpu_scalar = true;
      return;
    }
    non_bool_tensor |= t.is_privateuseone() && t.scalar_type() != c10::kBool;
    note(t.scalar_type());
    if (t.is_complex() && !t.is_privateuseone() && (t.dim() != 0 || t.scalar_type() == c10::kComplexHalf))
      complex_cpu_scalar = true;  // per-element _foreach_ scalars, complex32: the CPU computes them
  };
  for (size_t i = 0; i < stack_args.size(); ++i) {
    const c10::IValue& v = stack_args[i];
    if (v.isTensor()) note_tensor(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList().vec()) note_tensor(t);
    else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) note_tensor(e.toTensor());
    } else if (v.isComplexDouble()) {
      const std::string& name = i < schema.arguments().size() ? schema.arguments()[i].name() : "";
      has_complex = true;
      complex_cpu_scalar |= !complex_scalar_arg_ops.count(base) || name == "alpha";
    }
    else if (is_uint64_scalar(v)) unsigned_cpu_scalar = true;
    else if (v.isInt() && i < schema.arguments().size()) {
      c10::TypePtr type = schema.arguments()[i].real_type();
      if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
      if (type->kind() == c10::TypeKind::ScalarTypeType) note(static_cast<c10::ScalarType>(v.toInt()));
    }
  }
  if (complex_cpu_scalar) return false;
  // Antialiased uint8 images: CPU's fixed-point kernel (int16 weights) computes them.
  if ((base == "_upsample_bilinear2d_aa" || base == "_upsample_bicubic2d_aa") && !stack_args.empty() &&
      stack_args[0].isTensor() && !c10::isFloatingType(stack_args[0].toTensor().scalar_type()))
    return false;
  has_unsigned |= unsigned_cpu_scalar && !non_bool_tensor;
  if (has_unsigned && !unsigned_ops.count(base)) return false;
  if (has_complex && !complex_ops.count(base)) return false;
  if (has_float8 && !float8_ops.count(base)) return false;
  // (index_put with accumulate=True adds: in float8 arithmetic CPU saturates
  // its kernel's sums, XLA's make NaN; CPU computes it.)
  if (has_float8 && (base == "index_put" || base == "_index_put_impl") && stack_args.size() > 3 &&
      stack_args[3].isBool() && stack_args[3].toBool())
    return false;
  // A complex normal with a tensor mean or std: PyTorch's Meta function
  // (its Python ref) fails on it where CPU's kernel does not; CPU draws it.
  if (has_complex && base == "normal" &&
      (stack_args.size() < 3 || !stack_args[1].isDouble() || !stack_args[2].isDouble()))
    return false;
  // A complex fill value of a real tensor: CPU's overflow error ("value cannot
  // be converted to type float without overflow"), from its kernel.
  if (has_complex && base == "masked_fill" && !stack_args.empty() && stack_args[0].isTensor() &&
      !stack_args[0].toTensor().is_complex())
    return false;
  return true;
}

// What an operator's calls share: its lowering and names, worked out once
// per operator (no string building per call on the hot path).
struct OpStatic {
  std::string base, lookup_overload, display;
  bool foreach = false;
  // nansum(x, dim=[]) reduces every dim on CPU, but PyTorch's Meta function
  // (which gives the lowering its result shape) reduces none: CPU computes it.
  bool empty_dims_mean_all = false;
  // In-place index ops whose self may not overlap its index or source at all
  // (CPU's assert_no_overlap: i.index_add_(0, i, i.clone()) raises).
  bool self_apart_from_inputs = false;
  const lowering::LoweringInfo* info = nullptr;
  FloatMode mode = FloatMode::Unknown;  // once learned (it never changes after)
  // The same for calls with a runtime int argument (learned apart: a lowering
  // may read an int exponent's value where it takes a float one at run time).
  FloatMode int_mode = FloatMode::Unknown;
  std::string int_mode_name;  // display + " (int)"
  // A composite op routed here (lowering_routes.cpp): its PyTorch kernel.
  std::optional<c10::DispatchKey> composite;
  // Its programs have float32 dots or convolutions: keyed by torch's matmul
  // precision too (learned from the first such plan).
  bool f32_precision = false;
  // torch.jit.trace records not this op but the op its PyTorch kernel calls
  // (convolution -> _convolution): while tracing, that kernel runs.
  bool jit_records_inner = false;
};

// A CPU tensor that is not a scalar among the arguments.
bool has_cpu_tensor(c10::ArrayRef<c10::IValue> args) {
  auto is_cpu = [](const c10::IValue& v) {
    return v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu() && v.toTensor().dim() > 0;
  };
  for (const c10::IValue& v : args) {
    if (is_cpu(v)) return true;
    if (v.isTensorList() || v.isList())
      for (const c10::IValue& e : v.toListRef())
        if (is_cpu(e)) return true;
  }
  return false;
}

OpStatic& op_static(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpStatic>> known;
  const auto& schema = op.schema();
  auto& slot = known[&schema];
  if (slot) return *slot;
  auto st = std::make_unique<OpStatic>();
  const std::string& overload = schema.overload_name();
  // In-place variants ("add_") reuse the functional lowering; the executor writes back.
  st->base = strip_namespace(schema.name());
  if (st->base.size() > 1 && st->base.back() == '_' && st->base.compare(0, 2, "__") != 0) st->base.pop_back();
  st->lookup_overload = overload;
  if (st->base.rfind("_foreach_", 0) == 0) {
    st->foreach = true;
    st->base = st->base.substr(9);
    // _foreach_add.List -> add.Tensor; .Scalar/.ScalarList -> add.Scalar.
    if (overload == "List") st->lookup_overload = "Tensor";
    else if (overload == "ScalarList") st->lookup_overload = "Scalar";
  }
  st->display = op_display_name(schema);
  st->int_mode_name = st->display + " (int)";
  st->info = lowering::find_lowering(st->base, st->lookup_overload);
  for (auto key : {c10::DispatchKey::CompositeExplicitAutograd, c10::DispatchKey::CompositeExplicitAutogradNonFunctional})
    if (!st->composite && op.hasKernelForDispatchKey(key)) st->composite = key;
  static const std::set<std::string> untraced = {"convolution", "conv_tbc"};  // PyTorch's DONT_RECORD_TRACE
  st->jit_records_inner = st->composite && untraced.count(st->base);
  // An overload whose Meta kernel PyTorch got wrong or left out, so no plan
  // can be made for empty outs, takes the CPU fallback (torch 2.13:
  // bucketize.Scalar's Python meta function has no out= argument;
  // _batch_norm_with_update.out has none).
  if (st->display == "aten::bucketize.Scalar_out" || st->display == "aten::_batch_norm_with_update.out")
    st->info = nullptr;
  st->empty_dims_mean_all = st->base == "nansum";
  static const std::set<std::string> apart = {"index_add", "index_copy", "index_fill", "index_put",
                                              "_index_put_impl", "put", "scatter", "scatter_add"};
  const auto& a0 = schema.arguments();
  st->self_apart_from_inputs = apart.count(st->base) && !a0.empty() && a0[0].name() == "self" &&
                               a0[0].alias_info() && a0[0].alias_info()->isWrite();
  slot = std::move(st);
  return *slot;
}
// A tensor the op writes that partially overlaps one it reads (x[1:] += x[:-1],
// x[1:].copy_(x[:-1]), add(out=) over its input) raises PyTorch's own error,
// as CPU's kernels do: a program reads all inputs before it writes, so it
// would give another answer than CPU's element-by-element loop. Per call:
// storage offsets are not part of the program's key.
void check_partial_overlap(const OpInstance& inst, const c10::FunctionSchema& schema) {
  if (inst.foreach || inst.storages.size() >= inst.slots.size()) return;  // no storage shared
  for (const Slot& w : inst.slots) {
    const auto* alias = schema.arguments()[w.arg_index].alias_info();
    if (!alias || !alias->isWrite()) continue;
    for (const Slot& r : inst.slots)
      if (&r != &w && r.storage == w.storage && !r.pure_output) at::assert_no_partial_overlap(w.tensor, r.tensor);
  }
}
}  // namespace

// Validated float mode: the Meta kernel raises for invalid values, as CPU
// does; values it accepted for this plan before are not checked again (the
// Meta check depends on the key, which the plan matched, and these values).
void validate_floats(Plan& plan, const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, OpInstance& inst) {
  constexpr size_t kRemembered = 8;
  std::vector<uint64_t> bits;
  for (const ScalarInput& s : inst.scalars) {
    if (!s.from_arg) continue;
    uint64_t b;
    std::memcpy(&b, &s.value, sizeof(b));
    bits.push_back(b);
  }
  for (const auto& seen : plan.validated_floats)
    if (seen == bits) return;
  std::vector<Resize> unused;
  run_meta(op, args, inst, &unused, /*dry=*/true);
  if (plan.validated_floats.size() < kRemembered) {
    plan.validated_floats.push_back(std::move(bits));
  } else {
    plan.validated_floats[plan.validated_next] = std::move(bits);
    plan.validated_next = (plan.validated_next + 1) % kRemembered;
  }
}

void lowering_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpStatic& st = op_static(op);
  device::DeviceLock lock;  // one op at a time on tpu storages (device_lock.h)
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  auto args = torch::jit::last(*stack, nargs);
  // A routed composite op given CPU data (copy(tpu, cpu), as CUDA takes it):
  // PyTorch's composite kernel moves it, or raises CUDA's mixed-device error.
  if (st.composite && !st.foreach &&
      (has_cpu_tensor(args) || (st.jit_records_inner && at::tracer::impl::is_dispatch_enabled()))) {
    op.callBoxedForDispatchKey(*st.composite, *stack);
    return;
  }

  const std::string& base = st.base;
  const std::string& lookup_overload = st.lookup_overload;
  const std::string& display = st.display;
  OpInstance inst;
  inst.foreach = st.foreach;
  runtime::OpLabel label(display);
  const lowering::LoweringInfo* info = st.info;
  bool dtype_refused = info && !lowering_handles_dtypes(base, args, schema);
  if (dtype_refused) info = nullptr;
  if (st.self_apart_from_inputs && args[0].isTensor()) {
    const at::Tensor& self = args[0].toTensor();
    auto apart_from = [&](const at::Tensor& t) {
      if (t.defined() && t.device() == self.device()) at::assert_no_overlap(self, t);
    };
    for (size_t i = 1; i < nargs; ++i) {
      if (args[i].isTensor()) apart_from(args[i].toTensor());
      else if (args[i].isList())
        for (const c10::IValue& e : args[i].toListRef())
          if (e.isTensor()) apart_from(e.toTensor());
    }
  }
  if (info && st.empty_dims_mean_all && nargs > 1 && args[0].isTensor() && args[0].toTensor().dim() > 0 &&
      args[1].isIntList() && args[1].toIntList().empty())
    info = nullptr;
  if (info) {
    // Lazy conj/neg bits reach here only on ops the Conjugate/Negative
    // fallbacks pass through (clone, which resolve_conj uses, _to_copy, ...):
    // read inputs' values (copy_ resolves the bits).
    for (size_t i = 0; i < nargs; ++i) {
      c10::IValue& v = (*stack)[stack->size() - nargs + i];
      const auto* alias = schema.arguments()[i].alias_info();
      if (!v.isTensor() || (alias && alias->isWrite())) continue;
      const at::Tensor& t = v.toTensor();
      if (t.defined() && (t.is_conj() || t.is_neg())) {
        at::Tensor r = at::empty(t.sizes(), t.options());  // no bits; copy_ applies t's
        r.copy_(t);
        v = r;
      }
    }
    args = torch::jit::last(*stack, nargs);
  }
  if (!info) {
    run_on_cpu(op, stack, dtype_refused);
    return;
  }

  describe(inst, schema, args);
  if (st.f32_precision) inst.put(static_cast<char>(device::f32_matmul_precision()));
  check_partial_overlap(inst, schema);
  c10::OptionalDeviceGuard guard;
  if (inst.device >= 0)
    guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(inst.device)));

  // With no float arguments the two keys are the same, and an op that never
  // takes one (add(x, y)) never learns its mode: no per-call lookup then.
  auto [floats, ints] = scalar_args(inst);
  FloatMode& op_mode = ints ? st.int_mode : st.mode;
  const std::string& mode_name = ints ? st.int_mode_name : display;
  if (floats && op_mode == FloatMode::Unknown) op_mode = float_mode(mode_name);
  FloatMode mode = op_mode;
  bool runtime_floats = mode == FloatMode::Dynamic || mode == FloatMode::Validated;
  thread_local std::string static_key;
  std::shared_ptr<Plan> plan =
      cache_find(runtime_floats || !floats ? inst.key_view() : inst.static_key_into(static_key));
  if (plan) {
    runtime::metrics().executable_cache_hits++;
    if (!plan->scalar_checks.empty()) check_scalars(plan->scalar_checks, inst, display);
    if (plan->int_value_checks) check_int_values(op, args, inst, plan->accepted_ints, plan->accepted_next);
    if (mode == FloatMode::Validated) validate_floats(*plan, op, args, inst);
    for (const Resize& r : plan->resizes) {
      // PyTorch's deprecation warning for resizing a non-empty out=, on every
      // call as CPU gives it (the Meta kernel gave it when the plan was built).
      at::native::resize_output_check(inst.slots[r.slot].tensor, r.sizes);
      inst.slots[r.slot].tensor.resize_(r.sizes);
      inst.storages[inst.slots[r.slot].storage] = &device::storage_of(inst.slots[r.slot].tensor);
    }
  } else {
    runtime::metrics().executable_cache_misses++;
    std::vector<Resize> resizes;
    torch::jit::Stack meta;
    try {
      meta = run_meta(op, args, inst, &resizes);
    } catch (const std::exception&) {
      // CPU's error type where CPU raises too; CPU's results where it does not.
      std::optional<torch::jit::Stack> cpu = meta_failed(op, args, info->needs_rng);
      if (!cpu) throw;
      meta = std::move(*cpu);
    }
    real_compute_for_complex_out(op, args, meta);
    // What only CPU's kernel checks (a dtype it does not implement, an out=
    // dtype, a scalar that does not fit): asked once per new signature.
    check_like_cpu(op, args, info->needs_rng, meta);
    bool dynamic = mode != FloatMode::Static;
    plan = lower(op, args, inst, *info, base, lookup_overload, meta, dynamic);
    if (dynamic && mode == FloatMode::Unknown && floats) {
      FloatMode learned = learn_float_mode(op, args, inst, *info, base, lookup_overload, *plan);
      set_float_mode(mode_name, learned);
      op_mode = learned;
      if (learned == FloatMode::Static) {
        dynamic = false;
        plan = lower(op, args, inst, *info, base, lookup_overload, meta, false);
      }
    } else if (dynamic && plan->read_scalar_value) {
      // (A known-dynamic op whose lowering read a float after all.)
      dynamic = false;
      set_float_mode(mode_name, FloatMode::Static);
      op_mode = FloatMode::Static;  // (the per-operator copy too, else every call would miss)
      plan = lower(op, args, inst, *info, base, lookup_overload, meta, false);
    }
    plan->resizes = std::move(resizes);
    // A float argument that is a runtime input: CPU's overflow check, per call.
    if (dynamic) plan->scalar_checks = learn_scalar_checks(op, args, inst, info->needs_rng, meta);
    // Runtime ints (wrapped ones in every mode): does CPU check their values?
    if (has_runtime_ints(inst, dynamic) && learn_int_value_checks(op, args, inst, info->needs_rng)) {
      plan->int_value_checks = true;
      check_int_values(op, args, inst, plan->accepted_ints, plan->accepted_next);  // (remembers this call's)
    }
    if (!plan->text.empty()) plan->exe = compile_plan(*plan, display);
    if (plan->f32_precision && !st.f32_precision) {
      st.f32_precision = true;  // this call's key gets what later calls' keys will have
      inst.put(static_cast<char>(device::f32_matmul_precision()));
    }
    cache_put(dynamic ? std::string(inst.key_view()) : inst.static_key(), plan);
  }
  for (const std::string& w : plan->warnings) TORCH_WARN(w);
  if (!plan->warnings_once.empty()) warn_once(plan->warnings_once);
  if (fused_active() && fused_record(plan, inst, args, stack, nargs)) return;
  run_plan(*plan, schema, inst, args, stack, nargs);
}

bool record_programs(bool on) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  bool was = g_recording;
  g_recording = on;
  return was;
}

std::vector<std::pair<std::string, std::string>> take_recorded_programs() {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  return std::exchange(g_recorded, {});
}

std::vector<runtime::BufferPtr> run_cached(
    const std::string& key, const std::vector<runtime::BufferPtr>& inputs, int device,
    const std::function<std::vector<Value>(Builder&)>& build) {
  std::shared_ptr<Plan> plan = cache_find(key);
  if (plan) {
    runtime::metrics().executable_cache_hits++;
  } else {
    runtime::metrics().executable_cache_misses++;
    Builder b;
    std::vector<Value> outs = build(b);
    plan = std::make_shared<Plan>();
    plan->exe = compile_program(b.finish(outs), "internal program");
    cache_put(key, plan);
  }
  return rt().execute(*plan->exe, inputs, device);
}

namespace {
// Key of an internal program that reads or writes view `t` of storage `sb`
// (not its storage offset: a runtime input, see offset_buffer).
std::string view_key(const char* what, const at::Tensor& t, const StorageBuffer& sb, DType dt) {
  std::string key = what;
  put(key, static_cast<char>(dt));
  put(key, static_cast<char>(sb.dtype));
  put(key, static_cast<int64_t>(sb.numel()));
  put(key, t.sizes());
  put(key, t.strides());
  return key;
}

runtime::BufferPtr offset_buffer(const at::Tensor& t, int device) {
  int64_t offset = t.storage_offset();
  return runtime::constant_buffer(&offset, PJRT_Buffer_Type_S64, {}, device);
}
}  // namespace

runtime::BufferPtr materialize(const at::Tensor& t) {
  FlushReason reason("host_read");
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  const auto& buffer = device::ensure_buffer(sb, dt);
  if (sb.dtype == dt &&
      lowering::covers_whole(t.sizes().data(), t.strides().data(), t.dim(), t.storage_offset(), sb.numel()))
    return buffer;
  StridedView view = view_of(t);
  std::string key = view_key("$read|", t, sb, dt);
  TensorType storage_type{sb.dtype, {sb.numel()}};
  int64_t n = t.numel();
  return run_cached(key, {buffer, offset_buffer(t, sb.device)}, sb.device, [&](Builder& b) {
    Value flat = lowering::reinterpret_flat(b, b.param(storage_type), dt);
    Value offset = b.param(TensorType{DType::I64, {}});
    return std::vector<Value>{b.reshape(lowering::read_strided(b, flat, view, offset), {n})};
  })[0];
}

void assign(const at::Tensor& t, runtime::BufferPtr values) {
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  StridedView view = view_of(t);
  at::assert_no_internal_overlap(t);
  settle(sb);  // a fused trace's later result must not overwrite this write
  if (sb.nbytes % lowering::itemsize(dt) == 0 &&
      view.covers_whole(static_cast<int64_t>(sb.nbytes) / lowering::itemsize(dt))) {
    sb.buffer = std::move(values);
    sb.dtype = dt;
    return;
  }
  const auto& base = device::ensure_buffer(sb, dt);
  std::string key = view_key("$write|", t, sb, dt);
  TensorType storage_type{sb.dtype, {sb.numel()}};
  TensorType values_type{dt, {t.numel()}};
  auto out = run_cached(key, {base, values, offset_buffer(t, sb.device)}, sb.device, [&](Builder& b) {
    Value flat = lowering::reinterpret_flat(b, b.param(storage_type), dt);
    Value v = b.reshape(b.param(values_type), view.sizes);
    Value offset = b.param(TensorType{DType::I64, {}});
    return std::vector<Value>{lowering::write_strided(b, flat, v, view, offset)};
  });
  sb.buffer = out[0];
  sb.dtype = dt;
}

int64_t executable_cache_size() { return cache().size(); }

std::map<std::string, std::string> float_modes() {
  static const char* kNames[] = {"unknown", "runtime", "validated", "by value"};
  std::lock_guard<std::mutex> lock(g_mode_mutex);
  std::map<std::string, std::string> out;
  for (const auto& [op, m] : g_float_mode) out[op] = kNames[static_cast<int>(m)];
  return out;
}

void clear_executable_cache() {
  cache().clear();
  fused_clear_programs();
}

}  // namespace torch_pjrt::eager
