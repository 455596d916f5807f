#include "eager/cpu_check.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <sstream>
#include <stdexcept>

#include "eager/cpu_threads.h"
#include "eager/env.h"
#include "eager/ivalue_tensors.h"

namespace torch_pjrt::eager {

namespace {

// Calls of at most this many elements (tpu inputs and outputs together) are
// probed; larger ones are not (their probe would cost as much as the call).
constexpr int64_t kProbeElements = 4096;
// A value no float argument fits in any dtype but double.
constexpr double kHugeFloat = 1e300;

// TORCH_PJRT_CPU_CHECKS=off: no probe (an escape hatch should a CPU kernel's
// check reject a call the tpu computes well; also for measuring the probe).
bool enabled() {
  static const bool on = env_choice("TORCH_PJRT_CPU_CHECKS", "on", {"on", "off"}) == "on";
  return on;
}

// What CPU raised, kept to raise again with the same type.
struct CpuError {
  enum Kind { Runtime, NotImplemented, Value, Type, Index } kind = Runtime;
  std::string message;
};

enum class Outcome { Ok, Failed, Ignored };

// A probe tensor filled with `fill` (its real part, for complex dtypes).
at::Tensor& fill_probe(at::Tensor& t, double fill) {
  return t.fill_(t.is_complex() ? c10::Scalar(c10::complex<double>(fill, 0)) : c10::Scalar(fill));
}

// The probe's copy of one argument: tpu tensors become CPU tensors of the same
// dtype, shape (and dense layout) filled with `fill`.
struct ProbeArgs {
  double fill;
  // tpu storages two or more arguments view: one CPU storage each, viewed at
  // the same sizes, strides and offsets, so that CPU's overlap checks
  // (masked_select(x, m, out=x): "some elements of the input tensor and the
  // written-to tensor refer to a single memory location") see the aliasing.
  mutable std::unordered_map<const c10::StorageImpl*, at::Tensor> shared;
  at::Tensor tensor(const at::Tensor& t) const {
    if (!t.defined()) return t;
    // A CPU argument (a 0-d scalar, an optimizer's step count) is copied: the
    // probe may write it.
    if (t.device().type() != c10::DeviceType::PrivateUse1) return t.clone();
    auto it = shared.find(t.storage().unsafeGetStorageImpl());
    if (it != shared.end()) {
      at::Tensor& bytes = it->second;
      if (!bytes.defined()) {
        int64_t n = static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.element_size());
        bytes = at::empty({n}, t.options().device(c10::kCPU));
        fill_probe(bytes, fill);
      }
      if (bytes.scalar_type() == t.scalar_type())
        return at::empty({0}, bytes.options()).set_(bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
    }
    // The call's strides where they describe a whole dense block (a
    // transposed operand: kernels check layouts, e.g. _grouped_mm's 16-byte
    // strides), else contiguous.
    at::TensorOptions cpu = t.options().device(c10::kCPU);
    at::Tensor r = t.is_non_overlapping_and_dense() ? at::empty_strided(t.sizes(), t.strides(), cpu)
                                                     : at::empty(t.sizes(), cpu);
    return fill_probe(r, fill);
  }
  c10::IValue operator()(const c10::IValue& v) const {
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kCPU);
    return map_tensors(v, [&](const at::Tensor& t) { return tensor(t); });
  }
};

torch::jit::Stack probe_stack(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                              const ProbeArgs& make) {
  std::unordered_map<const c10::StorageImpl*, int> uses;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 && t.storage().nbytes() > 0)
      ++uses[t.storage().unsafeGetStorageImpl()];
  });
  for (const auto& [storage, n] : uses)
    if (n > 1) make.shared.emplace(storage, at::Tensor());
  torch::jit::Stack stack;
  for (const auto& v : args) stack.push_back(make(v));
  return stack;
}

// The probe's own warnings (an out= tensor resized) are not the user's.
struct QuietWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// Runs the op on `stack` (CPU or meta tensors); what it raised, if anything.
Outcome call(const c10::OperatorHandle& op, torch::jit::Stack stack, CpuError* err) {
  QuietWarnings quiet;
  c10::WarningUtils::WarningHandlerGuard quiet_guard(&quiet);
  SerialCpuOffHome serial;
  try {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&stack);
    return Outcome::Ok;
  } catch (const c10::NotImplementedError& e) {
    std::string msg = e.what_without_backtrace();
    // Only a dtype the kernel does not implement (AT_DISPATCH's message): no
    // CPU kernel at all, or a stub for devices to override, says nothing.
    if (msg.find("not implemented for '") == std::string::npos) return Outcome::Ignored;
    if (err) *err = CpuError{CpuError::NotImplemented, msg};
  } catch (const c10::IndexError& e) {
    // Mostly an index value of the probe's data (the device checks the real
    // ones); kept, since a failure raised only when both probes (zeros, ones)
    // fail alike is a shape check (kthvalue over an empty dim), or an index
    // into an empty dim that every value fails.
    if (err) *err = CpuError{CpuError::Index, e.what_without_backtrace()};
  } catch (const c10::LinAlgError&) {
    return Outcome::Ignored;  // the probe's matrix, not the call's
  } catch (const c10::ValueError& e) {
    if (err) *err = CpuError{CpuError::Value, e.what_without_backtrace()};
  } catch (const c10::TypeError& e) {
    if (err) *err = CpuError{CpuError::Type, e.what_without_backtrace()};
  } catch (const c10::Error& e) {
    if (err) *err = CpuError{CpuError::Runtime, e.what_without_backtrace()};
  } catch (const std::runtime_error& e) {
    // (checked_convert's overflow: c10::report_overflow throws std::runtime_error.)
    if (err) *err = CpuError{CpuError::Runtime, e.what()};
  } catch (const std::exception&) {
    return Outcome::Ignored;  // (a Python kernel's error: not a check of this kind)
  }
  return Outcome::Failed;
}

// The call fails as `err` did (type and message).
bool same_failure(const c10::OperatorHandle& op, torch::jit::Stack stack, const CpuError& err) {
  CpuError again;
  return call(op, std::move(stack), &again) == Outcome::Failed && again.kind == err.kind &&
         again.message == err.message;
}

bool skipped(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, bool random,
             bool backward_ok = false) {
  if (random) return true;  // would draw from CPU's generator
  // CPU kernels that crash the process: the bfloat16 _weight_int8pack_mm
  // kernel for K not a multiple of 8, _native_batch_norm_legit.no_stats in
  // eval mode and _batch_norm_no_update without running stats (none to
  // read). The Meta kernel and the lowering check these ops' arguments.
  if (schema.name() == "aten::_weight_int8pack_mm") return true;
  if (schema.name() == "aten::_batch_norm_no_update" && args.size() > 4 && (args[3].isNone() || args[4].isNone()))
    return true;
  if (schema.name() == "aten::_native_batch_norm_legit" && schema.overload_name().rfind("no_stats", 0) == 0) {
    auto training = schema.argumentIndexWithName("training");
    if (training && *training < args.size() && args[*training].isBool() && !args[*training].toBool()) return true;
  }
  // Autograd's own calls: CPU's backward kernels take what CPU's forward
  // gives (a bfloat16 batch norm's float statistics), which the tpu forward
  // need not; a user's error shows at the forward. (Where the Meta kernel
  // has refused the call already, CPU's kernel may still name the error.)
  const std::string& name = schema.name();
  if (!backward_ok && name.size() > 9 && name.compare(name.size() - 9, 9, "_backward") == 0) return true;
  for (const auto& r : schema.returns())
    if (r.alias_info() && !r.alias_info()->isWrite()) return true;  // a view: no kernel computes
  const auto& sargs = schema.arguments();
  for (size_t i = 0; i < sargs.size(); ++i) {
    auto t = sargs[i].real_type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    // (A generator left None is CPU's default one in the probe: meta_failed
    // keeps its state; a tpu generator cannot go to a CPU kernel.)
    bool none = i < args.size() && args[i].isNone();
    if ((t->kind() == c10::TypeKind::GeneratorType && !(backward_ok && none)) ||
        t->kind() == c10::TypeKind::StorageType)
      return true;
  }
  for (const auto& v : args)
    if (v.isStorage() || v.isObject() || v.isCapsule()) return true;
  return false;
}

int64_t tpu_elements(c10::ArrayRef<c10::IValue> args) {
  int64_t n = 0;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) n += t.numel();
  });
  return n;
}

int64_t output_elements(const torch::jit::Stack& stack) {
  int64_t n = 0;
  for (const auto& v : stack) {
    if (v.isTensor() && v.toTensor().defined()) n += v.toTensor().numel();
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) n += t.numel();
  }
  return n;
}


// Only calls this small are probed, with their own shapes and data of the
// probe's. (Smaller shapes of a larger call are not a valid call of the op in
// general: an int list argument such as layer_norm's normalized_shape must
// match them; PyTorch's Meta kernels do not check all of that.)
bool small_call(c10::ArrayRef<c10::IValue> args, int64_t meta_outputs) {
  return tpu_elements(args) + meta_outputs <= kProbeElements;
}

// PyTorch's own message first (tests match it from its start, "^Integer
// division"), then where it was raised.
[[noreturn]] void raise(const CpuError& e, const std::string& op, const std::string& dtypes) {
  std::string msg = e.message + " (torch_pjrt: " + op + " on tpu, " + dtypes + ")";
  switch (e.kind) {
    case CpuError::NotImplemented:
      TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case CpuError::Value:
      TORCH_CHECK_VALUE(false, msg);
    case CpuError::Type:
      TORCH_CHECK_TYPE(false, msg);
    case CpuError::Index:
      TORCH_CHECK_INDEX(false, msg);
    case CpuError::Runtime:
      break;
  }
  TORCH_CHECK(false, msg);
}

// checked_convert's names of its destination types (Scalar::to<T>'s #type).
const std::vector<std::pair<std::string, c10::ScalarType>>& checked_names() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> names = {
#define NAME_OF(type, name) {#type, c10::ScalarType::name},
      AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(NAME_OF)
#undef NAME_OF
      {"c10::Float8_e4m3fn", c10::kFloat8_e4m3fn},     {"c10::Float8_e5m2", c10::kFloat8_e5m2},
      {"c10::Float8_e4m3fnuz", c10::kFloat8_e4m3fnuz}, {"c10::Float8_e5m2fnuz", c10::kFloat8_e5m2fnuz},
  };
  return names;
}

template <typename T>
std::pair<double, double> range_of() {
  return {static_cast<double>(std::numeric_limits<T>::lowest()), static_cast<double>(std::numeric_limits<T>::max())};
}

// c10::overflows<To, double> (checked_convert skips bool).
bool overflows(double v, c10::ScalarType t) {
  if (t == c10::kBool || t == c10::kDouble || t == c10::kComplexDouble) return false;
  bool floating = c10::isFloatingType(t) || c10::isComplexType(t);
  // (float8_e4m3fn and the fnuz types have no infinity: inf overflows them.)
  bool has_inf = t != c10::kFloat8_e4m3fn && t != c10::kFloat8_e4m3fnuz && t != c10::kFloat8_e5m2fnuz;
  if (floating && (std::isnan(v) || (std::isinf(v) && has_inf))) return false;
  if (std::isnan(v)) return true;
  std::pair<double, double> r;
  switch (c10::isComplexType(t) ? c10::toRealValueType(t) : t) {
#define RANGE_OF(type, name) \
  case c10::ScalarType::name: r = range_of<type>(); break;
    AT_FORALL_SCALAR_TYPES_AND3(Bool, Half, BFloat16, RANGE_OF)
    RANGE_OF(c10::Float8_e4m3fn, Float8_e4m3fn)
    RANGE_OF(c10::Float8_e5m2, Float8_e5m2)
    RANGE_OF(c10::Float8_e4m3fnuz, Float8_e4m3fnuz)
    RANGE_OF(c10::Float8_e5m2fnuz, Float8_e5m2fnuz)
#undef RANGE_OF
    default:
      return false;
  }
  return v < r.first || v > r.second;
}

// Dtypes the lowering implements where PyTorch's CPU kernel does not, as its
// CUDA kernel does: integer histc (transformers' Mixture-of-Experts layers
// count tokens per expert so on every device but CPU). Bool is refused there too.
bool beyond_cpu(const c10::FunctionSchema& schema, const CpuError& err) {
  return err.kind == CpuError::NotImplemented && schema.name() == "aten::histc" &&
         err.message.find("'Bool'") == std::string::npos;
}

}  // namespace

std::string dtypes_of(c10::ArrayRef<c10::IValue> args) {
  std::ostringstream os;
  bool first = true;
  auto add = [&](const char* what) {
    os << (first ? "" : ", ") << what;
    first = false;
  };
  bool complex_scalar = false;  // a Python complex number (x * 1j) decides the dtype too
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1)
      add(c10::toString(t.scalar_type()));
    else if (t.dim() == 0 && t.is_complex())
      complex_scalar = true;
  });
  for (const c10::IValue& v : args) complex_scalar |= v.isComplexDouble();
  if (complex_scalar) add("a complex scalar");
  return os.str();
}

namespace {

// Bool, integer and complex tensors: the dtypes whose kernels CPU lacks for
// many ops (structurally, at any size; float16/bfloat16 support can depend on
// the path a size takes, e.g. cdist, and is not probed this way).
bool suspect_dtype(c10::ScalarType t) { return t == c10::kBool || c10::isIntegralType(t, false) || c10::isComplexType(t); }

// The control call's dtypes: the suspect ones as float32 when the call has
// any; else float32/float64 as int64 (bitwise ops of floats).
enum class Control { None, ToFloat, ToLong };

std::optional<c10::ScalarType> controlled(c10::ScalarType t, Control c) {
  if (c == Control::ToFloat && suspect_dtype(t)) return at::kFloat;
  if (c == Control::ToLong && (t == at::kFloat || t == at::kDouble)) return at::kLong;
  return std::nullopt;
}

// The probe's copy of an argument shrunk to at most 4 elements per dim, its
// dtypes (tensors' and ScalarType arguments') changed as `control` says.
c10::IValue shrunk(const c10::Argument& arg, const c10::IValue& v, double fill, Control control) {
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kCPU);
  if (v.isInt()) {
    auto type = arg.real_type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    if (type->kind() == c10::TypeKind::ScalarTypeType)
      if (auto to = controlled(static_cast<c10::ScalarType>(v.toInt()), control))
        return static_cast<int64_t>(*to);
    return v;
  }
  return map_tensors(v, [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    auto to = controlled(t.scalar_type(), control);
    if (t.device().type() != c10::DeviceType::PrivateUse1)
      return to && !t.unsafeGetTensorImpl()->is_wrapped_number() ? t.to(*to) : t.clone();
    std::vector<int64_t> sizes;
    for (int64_t s : t.sizes()) sizes.push_back(std::min<int64_t>(s, 4));
    at::Tensor r = at::empty(sizes, t.options().device(c10::kCPU).dtype(to ? *to : t.scalar_type()));
    return fill_probe(r, fill);
  });
}

torch::jit::Stack shrunk_stack(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, double fill,
                               Control control) {
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) stack.push_back(shrunk(schema.arguments()[i], args[i], fill, control));
  return stack;
}

// A call too large to probe whole: the same call shrunk to at most 4
// elements per dim fails alike with zeros and ones, and its control (other
// dtypes, above) does not fail: the dtype is what CPU's kernel refuses (bool
// addmv, integer softmax or avg_pool, bitwise ops of floats, ...), at any
// size. Otherwise (a shrunk shape CPU rejects, data it rejects) the call goes
// on unchecked, as before.
void check_dtypes_like_cpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) {
  bool suspect = false, halves = false;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return;
    suspect |= suspect_dtype(t.scalar_type());
    halves |= t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  });
  if (!suspect && halves) return;
  Control control = suspect ? Control::ToFloat : Control::ToLong;
  const auto& schema = op.schema();
  CpuError err;
  if (call(op, shrunk_stack(schema, args, 0.0, Control::None), &err) != Outcome::Failed || beyond_cpu(schema, err))
    return;
  if (!same_failure(op, shrunk_stack(schema, args, 1.0, Control::None), err)) return;
  if (call(op, shrunk_stack(schema, args, 1.0, control), nullptr) != Outcome::Ok &&
      call(op, shrunk_stack(schema, args, 0.0, control), nullptr) != Outcome::Ok)
    return;
  raise(err, op_display_name(schema), dtypes_of(args));
}

}  // namespace

void check_like_cpu(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, bool random,
                    const torch::jit::Stack& meta) {
  const auto& schema = op.schema();
  if (!enabled() || skipped(schema, args, random)) return;
  if (!small_call(args, output_elements(meta))) {
    check_dtypes_like_cpu(op, args);
    return;
  }
  CpuError err;
  if (call(op, probe_stack(schema, args, ProbeArgs{0.0}), &err) != Outcome::Failed) return;
  // The same call with other data: an error of the probe's zeros (a singular
  // matrix, an empty mask's selection) is not a check of this call; a check of
  // dtypes or arguments fails the same way for any data.
  if (beyond_cpu(schema, err) || !same_failure(op, probe_stack(schema, args, ProbeArgs{1.0}), err)) return;
  raise(err, op_display_name(schema), dtypes_of(args));
}

std::vector<ScalarCheck> learn_scalar_checks(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                             const OpInstance& inst, bool random, const torch::jit::Stack& meta) {
  std::vector<ScalarCheck> checks;
  const auto& schema = op.schema();
  bool any = false;
  for (const ScalarInput& s : inst.scalars) any |= s.from_arg && !s.is_int && s.arg >= 0;
  if (!any || !enabled() || skipped(schema, args, random)) return checks;
  // Whether CPU's kernel checks the conversion depends on dtypes, not sizes:
  // a large call is asked shrunk (every later value of the plan relies on it).
  bool small = small_call(args, output_elements(meta));
  for (size_t k = 0; k < inst.scalars.size(); ++k) {
    const ScalarInput& s = inst.scalars[k];
    // (Ints: check_int_values asks CPU itself, which also gets sub's -alpha right.)
    if (!s.from_arg || s.is_int || s.arg < 0 || static_cast<size_t>(s.arg) >= args.size()) continue;
    torch::jit::Stack stack = small ? probe_stack(schema, args, ProbeArgs{0.0})
                                    : shrunk_stack(schema, args, 0.0, Control::None);
    stack[s.arg] = kHugeFloat;  // (fits no narrower float type)
    CpuError err;
    if (call(op, std::move(stack), &err) != Outcome::Failed) continue;
    static const std::string kHead = "value cannot be converted to type ", kTail = " without overflow";
    auto at = err.message.find(kHead);
    if (at == std::string::npos) continue;
    auto from = at + kHead.size();
    auto to = err.message.find(kTail, from);
    if (to == std::string::npos) continue;
    std::string name = err.message.substr(from, to - from);
    for (const auto& [n, t] : checked_names())
      if (n == name) checks.push_back(ScalarCheck{static_cast<int>(k), t, n.c_str()});
  }
  return checks;
}

namespace {

// The probe's stack (the call shrunk, tensors all ones) with the runtime ints
// set to `values` (one per is_int scalar, in order): an int Scalar argument,
// or a wrapped integer tensor.
torch::jit::Stack int_probe_stack(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                                  const OpInstance& inst, const std::vector<int64_t>& values) {
  torch::jit::Stack stack = shrunk_stack(schema, args, 1.0, Control::None);
  size_t k = 0;
  for (const ScalarInput& s : inst.scalars) {
    if (!s.is_int) continue;
    int64_t v = values.at(k++);
    if (s.from_arg) {
      stack[s.arg] = v;
    } else {
      const at::Tensor& t = args[s.arg].toTensor();
      at::Tensor r = at::scalar_tensor(v, at::TensorOptions().dtype(t.scalar_type()));
      r.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
      stack[s.arg] = r;
    }
  }
  return stack;
}

std::vector<int64_t> int_values(const OpInstance& inst) {
  std::vector<int64_t> v;
  for (const ScalarInput& s : inst.scalars)
    if (s.is_int) v.push_back(static_cast<int64_t>(s.value));
  return v;
}

// Whether every runtime int can be set in a probe (a wrapped tensor in a list cannot).
bool ints_settable(c10::ArrayRef<c10::IValue> args, const OpInstance& inst) {
  bool any = false;
  for (const ScalarInput& s : inst.scalars) {
    if (!s.is_int) continue;
    if (s.arg < 0 || static_cast<size_t>(s.arg) >= args.size()) return false;
    if (!s.from_arg && !args[s.arg].isTensor()) return false;
    any = true;
  }
  return any;
}

bool asks_int_values(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                     bool random) {
  const auto& schema = op.schema();
  if (!enabled() || skipped(schema, args, random) || !ints_settable(args, inst)) return false;
  std::vector<int64_t> own = int_values(inst);
  if (call(op, int_probe_stack(schema, args, inst, own), nullptr) != Outcome::Ok) return false;
  // Zero, signs, the integer dtypes' edges, and far beyond them.
  static const int64_t kProbes[] = {0, -1, 1, 127, 128, -129, 255, 256, -256, 32768, -32769, int64_t{1} << 31,
                                    -(int64_t{1} << 31) - 1, int64_t{1} << 40, -(int64_t{1} << 40)};
  std::vector<const ScalarInput*> ints;  // (own's entries, in order)
  for (const ScalarInput& s : inst.scalars)
    if (s.is_int) ints.push_back(&s);
  for (size_t k = 0; k < ints.size(); ++k) {
    // (A CPU scalar tensor holds only values of its dtype: torch.tensor(n, dtype=torch.int16).)
    std::optional<c10::ScalarType> holder;
    if (!ints[k]->from_arg) holder = args[ints[k]->arg].toTensor().scalar_type();
    for (int64_t p : kProbes) {
      if (!exact_in_pack(p) || (holder && overflows(static_cast<double>(p), *holder))) continue;
      std::vector<int64_t> v = own;
      v[k] = p;
      if (call(op, int_probe_stack(schema, args, inst, v), nullptr) == Outcome::Failed) return true;
    }
  }
  return false;
}

}  // namespace

bool learn_int_value_checks(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                            bool random) {
  try {
    return asks_int_values(op, args, inst, random);
  } catch (const std::exception&) {
    return false;  // (a probe that cannot be built: nothing learned)
  }
}

void check_int_values(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args, const OpInstance& inst,
                      std::vector<std::vector<int64_t>>& accepted, size_t& next) {
  constexpr size_t kRemembered = 8;
  std::vector<int64_t> v = int_values(inst);
  for (const auto& seen : accepted)
    if (seen == v) return;
  const auto& schema = op.schema();
  CpuError err;
  // (The plan's own values passed on this same shrunk call with the same
  // data: a failure now comes from the ints.)
  if (call(op, int_probe_stack(schema, args, inst, v), &err) == Outcome::Failed)
    raise(err, op_display_name(schema), dtypes_of(args));
  if (accepted.size() < kRemembered) {
    accepted.push_back(std::move(v));
  } else {
    accepted[next] = std::move(v);
    next = (next + 1) % kRemembered;
  }
}

void check_scalars(const std::vector<ScalarCheck>& checks, const OpInstance& inst, const std::string& op) {
  for (const ScalarCheck& c : checks) {
    double v = inst.scalars[c.scalar].value;
    if (overflows(v, c.type))
      TORCH_CHECK(false, "torch_pjrt: ", op, " on tpu (", c10::toString(c.type), "): value cannot be converted to type ",
                  c.type_name, " without overflow");
  }
}

namespace {

at::Tensor meta_like(const at::Tensor& t) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  if (t.device().is_cpu() && t.dim() > 0) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

c10::IValue meta_arg(const c10::IValue& v) {
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
  return map_tensors(v, meta_like);
}

}  // namespace

// Random ops are asked too once their Meta kernel has refused the call
// (multinomial of a 3-d input: CPU's "prob_dist must be 1 or 2 dim"), with
// CPU's default generator put back as it was: the probe must not move the
// user's CPU random stream.
struct CpuGeneratorKept {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  CpuGeneratorKept() {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  ~CpuGeneratorKept() {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
};

std::optional<torch::jit::Stack> meta_failed(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                             bool random) {
  const auto& schema = op.schema();
  std::optional<CpuGeneratorKept> kept;
  if (random) kept.emplace();
  if (!enabled() || skipped(schema, args, /*random=*/false, /*backward_ok=*/true)) return std::nullopt;
  if (!small_call(args, 0)) return std::nullopt;
  SerialCpuOffHome serial;  // (the call below runs on CPU too)
  CpuError err;
  torch::jit::Stack stack = probe_stack(schema, args, ProbeArgs{0.0});
  Outcome first = call(op, stack, &err);
  if (first == Outcome::Failed) {
    if (!beyond_cpu(schema, err) && same_failure(op, probe_stack(schema, args, ProbeArgs{1.0}), err))
      raise(err, op_display_name(schema), dtypes_of(args));
    return std::nullopt;
  }
  if (first != Outcome::Ok) return std::nullopt;
  // CPU computes what PyTorch's Meta kernel refuses: its results' sizes,
  // strides and dtypes stand for the Meta results.
  stack = probe_stack(schema, args, ProbeArgs{0.0});
  torch::jit::Stack probe_args = stack;  // (the same tensors: out= ones as CPU left them)
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&stack);
  }
  // An out= tensor CPU resized: the executor's resize bookkeeping is Meta's; not here.
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isTensor() && probe_args[i].isTensor() && args[i].toTensor().defined() &&
        args[i].toTensor().sizes() != probe_args[i].toTensor().sizes())
      return std::nullopt;
  for (auto& v : stack) v = meta_arg(v);
  return stack;
}

void real_compute_for_complex_out(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                  torch::jit::Stack& meta) {
  const auto& schema = op.schema();
  const auto& sargs = schema.arguments();
  bool complex_out = false, complex_in = false;
  for (size_t i = 0; i < args.size(); ++i) {
    auto note = [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_complex()) return;
      (is_write(sargs[i]) && sargs[i].kwarg_only() ? complex_out : complex_in) = true;
    };
    if (args[i].isTensor()) note(args[i].toTensor());
    else if (args[i].isTensorList()) for (const at::Tensor& t : args[i].toTensorList()) note(t);
  }
  if (!complex_out || complex_in) return;
  // The functional overload ("sqrt" for "sqrt.out", "pow.Tensor_Scalar" for
  // "pow.Tensor_Scalar_out"): its Meta result's dtype is what CPU computes in.
  std::string overload = schema.overload_name();
  if (overload == "out") overload.clear();
  else if (overload.size() > 4 && overload.compare(overload.size() - 4, 4, "_out") == 0) overload.resize(overload.size() - 4);
  else return;
  auto functional = c10::Dispatcher::singleton().findOp(c10::OperatorName(schema.name(), overload));
  if (!functional) return;
  const auto& fargs = functional->schema().arguments();
  torch::jit::Stack stack;
  for (size_t i = 0; i < fargs.size(); ++i) {
    if (i >= args.size() || fargs[i].name() != sargs[i].name()) return;
    stack.push_back(meta_arg(args[i]));
  }
  try {
    at::AutoDispatchBelowADInplaceOrView guard;
    functional->callBoxed(&stack);
  } catch (const std::exception&) {
    return;
  }
  for (size_t r = 0; r < meta.size() && r < stack.size(); ++r) {
    if (!meta[r].isTensor() || !stack[r].isTensor()) continue;
    const at::Tensor& out = meta[r].toTensor();
    const at::Tensor& f = stack[r].toTensor();
    if (out.defined() && f.defined() && out.is_complex() && !f.is_complex())
      meta[r] = at::empty_strided(out.sizes(), out.strides(), out.options().dtype(f.scalar_type()));
  }
}

}  // namespace torch_pjrt::eager
