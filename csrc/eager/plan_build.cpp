#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <stdexcept>

#include "device/dtype_map.h"
#include "device/matmul_precision.h"
#include "eager/env.h"
#include "eager/ivalue_tensors.h"
#include "eager/plan.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::Arg;
using lowering::Builder;
using lowering::DType;
using lowering::StridedView;
using lowering::TensorType;
using lowering::Value;

// Runtime scalars travel as f64, except on TPUs, which have no f64 (there a
// float64 op's scalar is rounded to f32; f32 and narrower ops are unaffected).
DType scalar_pack_dtype() {
  static DType dt = runtime::Runtime::get().info().platform == "tpu" ? DType::F32 : DType::F64;
  return dt;
}

bool debug_mode() {
  static bool debug = env_choice("TORCH_PJRT_EAGER", "async", {"async", "debug", "fused"}) == "debug";
  return debug;
}

namespace {
std::atomic<int>& checks_setting() {  // -1: not read from the environment yet
  static std::atomic<int> on{-1};
  return on;
}
}  // namespace

bool checks_enabled() {
  int on = checks_setting().load(std::memory_order_relaxed);
  if (on < 0) {
    on = env_choice("TORCH_PJRT_CHECKS", "on", {"on", "off"}) == "on";
    checks_setting().store(on);
  }
  return on || debug_mode();  // debug mode always checks (it raises at the op)
}

void set_checks_enabled(bool on) { checks_setting().store(on); }

int register_check(const std::string& op, const lowering::LoweringContext::Check& c) {
  using E = lowering::LoweringContext::CheckError;
  auto kind = c.error == E::Index    ? runtime::ErrorKind::Index
              : c.error == E::LinAlg ? runtime::ErrorKind::LinAlg
                                     : runtime::ErrorKind::Runtime;
  return runtime::Runtime::get().register_check(kind, "torch_pjrt: " + op + ": " + c.message);
}

namespace {

c10::IValue to_meta(const c10::IValue& v) {
  auto conv = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (t.device().is_cpu() && t.dim() == 0 && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
      // CPU 0-d tensors too: Python meta kernels reject mixing cpu and meta.
      // (Wrapped Python numbers stay: the boxed-to-Python path needs them on CPU.)
      return at::empty({}, t.options().device(c10::kMeta));
    }
    if (t.device().type() != c10::DeviceType::PrivateUse1) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
  // Meta kernels draw nothing; PyTorch's Python refs refuse any generator.
  if (v.isGenerator()) return c10::IValue();
  return map_tensors(v, conv);
}

// Runs a lowering; a dimension or index out of range (std::out_of_range, as
// wrap_dim throws) becomes PyTorch's IndexError, as on CPU.
std::vector<Value> call_lowering(const lowering::LoweringInfo& info, lowering::LoweringContext& ctx) {
  try {
    return info.fn(ctx);
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const lowering::NotImplemented& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
  }
}

}  // namespace

// _foreach_ ops run their element op; argument names the element op knows.
const std::vector<std::pair<std::string, std::vector<std::string>>>& foreach_aliases() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> aliases = {
      {"scalar", {"other", "value", "min", "max"}},
      {"scalars", {"other", "value", "min", "max"}},
      {"other", {"min", "max"}},  // _foreach_clamp_min/max.List: clamp_min/max.Tensor's bound
      {"tensors1", {"end"}},
      {"weights", {"weight"}},
  };
  return aliases;
}

// arange/linspace out= forms (their lowerings lay a 1-d sequence out in any shape).
bool sequence_out(const c10::FunctionSchema& schema) {
  return schema.name() == "aten::arange" || schema.name() == "aten::linspace";
}

// PyTorch's own shape, dtype and error checks, on meta tensors; out= tensors
// are resized to what the meta kernel made of them.
torch::jit::Stack run_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                           OpInstance& inst, std::vector<Resize>* resizes, bool dry) {
  const auto& sargs = op.schema().arguments();
  torch::jit::Stack meta_stack;
  for (const auto& v : args) meta_stack.push_back(to_meta(v));
  if (dry || sequence_out(op.schema())) {
    // A dry run (another value's probe, a validity check) must not resize a
    // full out= tensor: PyTorch's Python meta kernels warn that resizing one
    // is deprecated. Empty outs resize silently; the sizes they get are
    // compared with the real outs' below all the same. (CPU's arange_out and
    // linspace_out resize without that warning.)
    for (size_t i = 0; i < sargs.size() && i < meta_stack.size(); ++i)
      if (sargs[i].kwarg_only() && is_write(sargs[i]) && meta_stack[i].isTensor() &&
          meta_stack[i].toTensor().defined())
        meta_stack[i] = at::empty({0}, meta_stack[i].toTensor().options());
  }
  std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
  if (op.schema().returns().empty() && !op.hasKernelForDispatchKey(c10::DispatchKey::Meta) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
    // Nothing to infer (e.g. _fused_sgd_ has no Meta kernel): the lowering
    // checks its own arguments.
    return {};
  }
  // Advanced indexing with more index tensors than dims: CPU raises
  // IndexError; PyTorch's Python Meta kernel of index raises RuntimeError.
  if (!sargs.empty() && sargs[0].name() == "self" && args.size() > 1 && args[0].isTensor())
    for (size_t i = 1; i < sargs.size() && i < args.size(); ++i)
      if (sargs[i].name() == "indices" && args[i].isList()) {
        int64_t dim = args[0].toTensor().dim(), n = static_cast<int64_t>(args[i].toListRef().size());
        TORCH_CHECK_INDEX(n <= dim, "too many indices for tensor of dimension ", dim, " (got ", n, ")");
      }
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
    // A structured op's functional or in-place form (add.Tensor, pow_):
    // PyTorch's C++ structured meta function and then its out= form's Meta
    // kernel, as CPU's kernel runs them. The Meta key of these forms is often
    // a Python meta function that disagrees with CPU (bool ** True gives
    // int64, _softmax_backward_data ignores input_dtype, leaky_relu_ with a
    // negative slope does not raise). PrivateUse2, a key no backend here
    // claims, resolves to the CompositeExplicitAutogradNonFunctional kernel.
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), &meta_stack);
  } else {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&meta_stack);
  }
  keep_cpu_memory_format(op, args, meta_stack);
  for (size_t i = 0; i < sargs.size(); ++i) {
    if (!is_write(sargs[i]) || !meta_args[i].isTensor()) continue;
    int s = -1;
    for (size_t k = 0; k < inst.slots.size(); ++k)
      if (inst.slots[k].arg_index == static_cast<int>(i)) s = static_cast<int>(k);
    if (s < 0) continue;
    const at::Tensor& m = meta_args[i].toTensor();
    const at::Tensor& given = inst.slots[s].tensor;
    if (m.sizes() != given.sizes() && m.numel() == given.numel() && sequence_out(op.schema())) {
      // arange/linspace(out=) of as many elements: CPU keeps out's shape
      // (the Meta kernels resize it to 1-d); the result takes out's shape.
      at::Tensor shaped = at::empty(given.sizes(), m.options());
      for (auto& v : meta_stack)
        if (v.isTensor() && v.toTensor().is_same(m)) v = shaped;
      continue;
    }
    if (!dry && m.numel() != given.numel() && given.numel() > 0 && op.schema().name() == "aten::arange")
      TORCH_WARN("The number of elements in the out tensor of shape ", given.sizes(), " is ", given.numel(),
                 " which does not match the computed number of elements ", m.numel(),
                 ". Note that this may occur as a result of rounding error. The out tensor will be resized to a "
                 "tensor of shape (", m.numel(), ",).");
    if (m.sizes() != inst.slots[s].tensor.sizes()) {
      // An in-place op's self is never resized, nor is an out= tensor that is
      // also an input (CPU's TensorIterator check). Some Python meta kernels
      // (floor_divide_) resize self as an out= tensor instead, and generic
      // in-place kernels (ldexp_, addr_) call out= forms with self as out.
      bool also_input = !sargs[i].kwarg_only();
      for (size_t j = 0; j < args.size() && !also_input; ++j)
        also_input = j != i && !is_write(sargs[j]) && args[j].isTensor() && args[i].isTensor() &&
                     args[j].toTensor().is_same(args[i].toTensor());
      TORCH_CHECK(!also_input, "output with shape ", inst.slots[s].tensor.sizes(),
                  " doesn't match the broadcast shape ", m.sizes());
      // CPU checks an out= tensor for internal overlap before resizing it (an
      // expanded out= tensor is not silently replaced by a new storage).
      at::assert_no_internal_overlap(inst.slots[s].tensor);
      resizes->push_back(Resize{s, m.sizes().vec()});
      if (dry) continue;
      inst.slots[s].tensor.resize_(m.sizes());
      // Growing swaps in a new storage.
      inst.storages[inst.slots[s].storage] = &device::storage_of(inst.slots[s].tensor);
    }
  }
  return meta_stack;
}

// The program for one op instance (not compiled yet).
std::shared_ptr<Plan> lower(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                            OpInstance& inst, const lowering::LoweringInfo& info,
                            const std::string& base, const std::string& overload,
                            const torch::jit::Stack& meta_stack, bool dynamic_floats) {
  const auto& schema = op.schema();
  const auto& sargs = schema.arguments();
  const auto& srets = schema.returns();
  auto plan = std::make_shared<Plan>();
  plan->dynamic_floats = dynamic_floats;

  auto aliased_arg = [&](size_t r) -> int {
    const auto* ra = srets[r].alias_info();
    if (!ra) return -1;
    for (size_t i = 0; i < sargs.size(); ++i) {
      const auto* aa = sargs[i].alias_info();
      if (aa && aa->beforeSets() == ra->beforeSets()) return static_cast<int>(i);
    }
    return -1;
  };
  auto slot_of_arg = [&](int arg_index) -> int {
    for (size_t s = 0; s < inst.slots.size(); ++s)
      if (inst.slots[s].arg_index == arg_index) return static_cast<int>(s);
    return -1;
  };

  Builder b;
  b.set_f32_precision(device::f32_matmul_precision());
  // Runtime scalars, one vector parameter (scalar_pack_dtype).
  std::optional<Value> scalar_pack;
  int64_t n_scalars = 0;
  for (const auto& s : inst.scalars) n_scalars += (!s.from_arg || dynamic_floats);
  if (n_scalars > 0) {
    scalar_pack = b.param(TensorType{scalar_pack_dtype(), {n_scalars}});
    plan->params.push_back(ParamSource{ParamSource::Scalars});
  }
  size_t scalar_cursor = 0;  // into inst.scalars
  int64_t pack_cursor = 0;   // into the pack
  // The next entry of inst.scalars: a runtime value, or nullopt when keyed by value.
  auto next_scalar = [&]() -> std::optional<Value> {
    const ScalarInput& s = inst.scalars.at(scalar_cursor++);
    if (s.from_arg && !dynamic_floats) return std::nullopt;
    int64_t k = pack_cursor++;
    return b.reshape(b.slice(*scalar_pack, {k}, {k + 1}), {});
  };

  // A complex scalar: its real and imaginary parts, two runtime scalars.
  auto next_complex = [&](DType dt) {
    DType part = lowering::real_dtype(dt);
    Value re = b.convert(*next_scalar(), part), im = b.convert(*next_scalar(), part);
    return b.op("stablehlo.complex", {re, im}, TensorType{dt, {}});
  };

  // Storage offsets, one s64 vector parameter (every slot's, at run time):
  // keys hold no offset, so one program serves a view at every offset.
  std::optional<Value> offset_pack;
  for (const Slot& s : inst.slots) {
    if (s.tensor.numel() == 0 || offset_pack) continue;
    DType dt = device::to_dtype(s.tensor.scalar_type());
    if (!view_of(s.tensor).covers_whole(static_cast<int64_t>(inst.storages[s.storage]->nbytes) /
                                        lowering::itemsize(dt))) {
      offset_pack = b.param(TensorType{DType::I64, {static_cast<int64_t>(inst.slots.size())}});
      plan->params.push_back(ParamSource{ParamSource::Offsets});
    }
  }
  auto offset_of = [&](const Slot& s) -> std::optional<Value> {
    if (!offset_pack) return std::nullopt;
    int64_t k = &s - inst.slots.data();
    return b.reshape(b.slice(*offset_pack, {k}, {k + 1}), {});
  };

  std::vector<std::optional<Value>> storage_param(inst.storages.size());
  // A storage never written (no buffer, owed by no trace; keyed apart in
  // op_instance.cpp) is zeros made inside the program: no zero buffer is
  // sent or kept for it, so an op that overwrites a new tensor (ones, a
  // random init on empty) holds one buffer of its size, not two.
  auto param_for = [&](int storage, DType dt) -> Value {
    if (!storage_param[storage]) {
      StorageBuffer* sb = inst.storages[storage];
      if (!sb->buffer && sb->pending < 0) {
        DType zd = sb->nbytes % lowering::itemsize(dt) == 0 ? dt : DType::U8;
        storage_param[storage] = b.zeros(TensorType{zd, {static_cast<int64_t>(sb->nbytes) / lowering::itemsize(zd)}});
      } else {
        storage_param[storage] = b.param(TensorType{sb->dtype, {sb->numel()}});
        plan->params.push_back(ParamSource{ParamSource::Storage, storage, sb->dtype});
      }
    }
    return *storage_param[storage];
  };
  auto read_slot = [&](const Slot& s) -> Value {
    DType dt = device::to_dtype(s.tensor.scalar_type());
    if (s.tensor.numel() == 0) return b.zeros(TensorType{dt, s.tensor.sizes().vec()});
    Value flat = lowering::reinterpret_flat(b, param_for(s.storage, dt), dt);
    return lowering::read_strided(b, flat, view_of(s.tensor), offset_of(s));
  };

  // ---- arguments (a foreach list argument gives one Arg per element) ----
  struct ArgForm {
    Arg whole;
    bool per_element = false;
    std::vector<Arg> elems;
    std::vector<int> elem_slots;  // tensor lists: the slot of each element
  };
  std::vector<ArgForm> forms(args.size());
  size_t slot_cursor = 0;
  auto tensor_arg = [&](const at::Tensor& t, bool pure_output, Arg* a, int* slot_out) {
    if (slot_out) *slot_out = -1;
    if (!t.defined()) return;
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      a->wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
      DType dt = device::to_dtype(t.scalar_type());
      a->kind = Arg::Tensor;
      if (c10::isComplexType(t.scalar_type())) {
        a->tensor = next_complex(dt);
      } else if (c10::isFloatingType(t.scalar_type())) {
        a->tensor = b.convert(*next_scalar(), dt);
      } else {
        c10::Scalar v = t.item();  // (exact in the pack: f64 -> integer converts exactly)
        a->tensor = runtime_int_scalar(t.scalar_type(), v) ? b.convert(*next_scalar(), dt) : b.constant(int_scalar(v), dt);
      }
      return;
    }
    int s = static_cast<int>(slot_cursor++);
    if (slot_out) *slot_out = s;
    if (pure_output) return;
    a->kind = Arg::Tensor;
    a->contiguous = t.is_contiguous();
    a->tensor = read_slot(inst.slots[s]);
  };
  auto scalar_arg = [&](const c10::IValue& v, Arg* a) {
    if (v.isComplexDouble()) {  // a Python complex: as PyTorch wraps one into a tensor
      a->kind = Arg::Tensor;
      a->wrapped_number = true;
      a->tensor = next_complex(DType::C128);
    } else if (v.isDouble()) {
      a->kind = Arg::Float;
      a->scalar = lowering::Scalar::from_float(v.toDouble());
      a->dynamic = next_scalar();
    } else if (is_uint64_scalar(v)) {
      a->kind = Arg::Int;
      a->scalar = lowering::Scalar::from_uint(v.toUInt());
    } else if (v.isBool()) {  // (an element of a Scalar[]: [True, 2, 0.5])
      a->kind = Arg::Bool;
      a->scalar = lowering::Scalar::from_bool(v.toBool());
    } else {
      a->kind = Arg::Int;
      a->scalar = lowering::Scalar::from_int(v.toInt());
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    ArgForm& f = forms[i];
    Arg& a = f.whole;
    a.name = sargs[i].name();
    bool pure_output = is_write(sargs[i]) && sargs[i].kwarg_only();
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (inst.foreach && t.defined() && t.device().is_cpu() && t.dim() == 1) {
        // Per-element scalars given as a CPU tensor.
        f.per_element = true;
        for (int64_t e = 0; e < t.numel(); ++e) {
          Arg ea;
          ea.name = a.name;
          ea.kind = Arg::Tensor;
          DType dt = device::to_dtype(t.scalar_type());
          ea.tensor = c10::isFloatingType(t.scalar_type())
                          ? b.convert(*next_scalar(), dt)
                          : b.constant(int_scalar(t[e].item()), dt);
          f.elems.push_back(ea);
        }
      } else {
        tensor_arg(t, pure_output, &a, nullptr);
      }
    } else if (v.isTensorList()) {
      a.kind = Arg::TensorList;
      f.per_element = inst.foreach;
      for (const at::Tensor& t : v.toTensorList()) {
        Arg ea;
        ea.name = a.name;
        int slot = -1;
        tensor_arg(t, pure_output, &ea, &slot);
        if (ea.kind == Arg::Tensor) a.tensors.push_back(ea.tensor);
        f.elems.push_back(ea);
        f.elem_slots.push_back(slot);
      }
    } else if (v.isList() && v.toListRef().size() > 0 &&
               (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
      a.kind = Arg::OptTensorList;
      for (const auto& e : v.toListRef()) {
        Arg ea;
        tensor_arg(e.isNone() ? at::Tensor() : e.toTensor(), false, &ea, nullptr);
        a.opt_tensors.push_back(ea.kind == Arg::Tensor ? std::optional<Value>(ea.tensor) : std::nullopt);
      }
    } else if (v.isBool()) {
      a.kind = Arg::Bool;
      a.scalar = lowering::Scalar::from_bool(v.toBool());
    } else if (v.isInt()) {
      // ScalarType and enum arguments are ints in the boxed calling convention.
      const auto& t = sargs[i].real_type();
      if (t->kind() == c10::TypeKind::ScalarTypeType ||
          (t->kind() == c10::TypeKind::OptionalType &&
           t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::ScalarTypeType)) {
        a.kind = Arg::ScalarType;
        a.dtype = device::to_dtype(static_cast<c10::ScalarType>(v.toInt()));
      } else {
        scalar_arg(v, &a);
        // An int Scalar argument (runtime_int_arg): the lowering sees it as an s64 value.
        if (runtime_int_arg(sargs[i], v.toInt()))
          if (std::optional<Value> d = next_scalar()) a.dynamic = b.convert(*d, DType::I64);
      }
    } else if (v.isDouble() || v.isComplexDouble() || is_uint64_scalar(v)) {
      scalar_arg(v, &a);
    } else if (v.isIntList()) {
      a.kind = Arg::IntList;
      a.ints = v.toIntVector();
    } else if (v.isBoolList()) {  // e.g. output_mask: 0/1 ints
      a.kind = Arg::IntList;
      for (bool e : v.toBoolList()) a.ints.push_back(e);
    } else if (v.isDoubleList()) {
      a.kind = Arg::FloatList;
      a.floats = v.toDoubleVector();
    } else if (is_scalar_list(v)) {
      a.kind = Arg::FloatList;
      f.per_element = inst.foreach;
      for (const auto& e : v.toListRef()) {
        a.floats.push_back(e.isDouble()            ? e.toDouble()
                           : is_uint64_scalar(e) ? static_cast<double>(e.toUInt())
                           : e.isBool()          ? static_cast<double>(e.toBool())
                                                 : static_cast<double>(e.toInt()));
        Arg ea;
        ea.name = a.name;
        if (inst.foreach) scalar_arg(e, &ea);
        f.elems.push_back(ea);
      }
    } else if (v.isString()) {
      a.kind = Arg::String;
      a.str = v.toStringRef();
    } else if (!v.isNone()) {
      a.kind = Arg::Other;
    }
  }

  std::optional<Value> rng_state;
  if (info.needs_rng) {
    rng_state = b.param(TensorType{DType::I64, {2}});
    plan->params.push_back(ParamSource{ParamSource::Rng});
  }

  // ---- results ----
  std::vector<Value> program_outputs;
  std::vector<std::optional<Value>> storage_value(inst.storages.size());
  std::vector<DType> storage_dtype(inst.storages.size());
  // Writes `res` into the view of slot `slot` (in-place results, mutations).
  auto write_slot = [&](int slot, Value res) {
    const Slot& s = inst.slots[slot];
    DType dt = device::to_dtype(s.tensor.scalar_type());
    res = b.convert(res, dt);
    if (res.shape() != s.tensor.sizes().vec()) res = b.broadcast_to(res, s.tensor.sizes().vec());
    // (fill_ and zero_ write one value everywhere, threshold_ a value of
    // each element's own input: CPU allows them on expanded views, and
    // duplicate positions then agree.)
    if (base != "fill" && base != "zero" && base != "threshold") at::assert_no_internal_overlap(s.tensor);
    StorageBuffer* sb = inst.storages[s.storage];
    StridedView view = view_of(s.tensor);
    if (s.tensor.numel() == 0) return;
    int64_t storage_numel = static_cast<int64_t>(sb->nbytes) / lowering::itemsize(dt);
    Value flat;
    if (!storage_value[s.storage] && view.covers_whole(storage_numel) &&
        sb->nbytes % lowering::itemsize(dt) == 0) {
      flat = b.reshape(res, {storage_numel});
    } else {
      // (Never written: zeros give the partial write a base.)
      Value base = storage_value[s.storage] ? *storage_value[s.storage] : param_for(s.storage, dt);
      flat = lowering::write_strided(b, lowering::reinterpret_flat(b, base, dt), res, view, offset_of(s));
    }
    storage_value[s.storage] = flat;
    storage_dtype[s.storage] = dt;
  };
  auto fresh_return = [&](const at::Tensor& m, Value res) {
    ReturnPlan rp;
    rp.kind = ReturnPlan::Fresh;
    rp.sizes = m.sizes().vec();
    rp.dtype = m.scalar_type();
    res = b.convert(res, device::to_dtype(m.scalar_type()));
    if (res.shape() != rp.sizes) res = b.broadcast_to(res, rp.sizes);
    std::vector<int64_t> perm;
    if (lowering::dense_permutation(m.sizes().vec(), m.strides().vec(), &perm)) {
      rp.strides = m.strides().vec();
      res = b.transpose(res, perm);
    } else {
      auto cs = c10::contiguous_strides(m.sizes());
      rp.strides.assign(cs.begin(), cs.end());
    }
    rp.output = static_cast<int>(program_outputs.size());
    program_outputs.push_back(b.reshape(res, {m.numel()}));
    plan->fresh_bytes += static_cast<int64_t>(
        at::detail::computeStorageNbytes(rp.sizes, rp.strides, c10::elementSize(rp.dtype)));
    plan->returns.push_back(rp);
  };

  if (inst.foreach) {
    // One element op per list index, all in this program.
    size_t n = 0;
    for (const auto& f : forms)
      if (f.per_element) { n = f.elems.size(); break; }
    bool inplace = srets.empty();
    int out_arg = -1;
    for (size_t i = 0; i < sargs.size(); ++i)
      if (sargs[i].name() == "out" && is_write(sargs[i]) && args[i].isTensorList()) out_arg = static_cast<int>(i);
    TORCH_CHECK(inplace || (srets.size() == 1 && meta_stack[0].isTensorList()),
                "torch_pjrt: ", op_display_name(schema), ": unexpected returns for a _foreach_ op");
    std::vector<at::Tensor> metas;
    if (!inplace) for (const at::Tensor& t : meta_stack[0].toTensorList()) metas.push_back(t);
    for (size_t e = 0; e < n; ++e) {
      lowering::LoweringContext ctx{b, base, overload, {}, {}, rng_state};
      ctx.default_float = device::to_dtype(c10::get_default_dtype_as_scalartype());
      for (size_t i = 0; i < forms.size(); ++i) {
        const ArgForm& f = forms[i];
        Arg a = f.per_element ? f.elems.at(e) : f.whole;
        ctx.args.push_back(a);
        for (const auto& [from, tos] : foreach_aliases()) {
          if (a.name != from) continue;
          for (const auto& to : tos) {
            Arg alias = a;
            alias.name = to;
            ctx.args.push_back(alias);
          }
        }
      }
      // In place: results go to self (which may be a Scalar: _foreach_pow.ScalarAndTensor),
      // or to `out` for the .out overloads, which return nothing either.
      int self_slot = !inplace ? -1 : out_arg >= 0 ? forms[out_arg].elem_slots.at(e) : forms[0].elem_slots.at(e);
      if (inplace) {
        const at::Tensor& t = inst.slots.at(self_slot).tensor;
        ctx.outputs.push_back(TensorType{device::to_dtype(t.scalar_type()), t.sizes().vec()});
      } else {
        ctx.outputs.push_back(TensorType{device::to_dtype(metas[e].scalar_type()), metas[e].sizes().vec()});
      }
      std::vector<Value> res = call_lowering(info, ctx);
      plan->read_scalar_value |= ctx.scalar_value_read;
      TORCH_CHECK(res.size() == 1, "torch_pjrt: ", op_display_name(schema), ": element lowering gave ",
                  res.size(), " results");
      if (inplace) write_slot(self_slot, res[0]);
      else fresh_return(metas[e], res[0]);
    }
    if (!inplace) plan->return_arity.push_back(static_cast<int>(n));  // one Tensor[] return
  } else {
    lowering::LoweringContext ctx{b, base, overload, {}, {}, rng_state};
    ctx.checks_enabled = checks_enabled();
    ctx.default_float = device::to_dtype(c10::get_default_dtype_as_scalartype());
    for (auto& f : forms) ctx.args.push_back(f.whole);
    // Result types: tensor returns, from the meta results.
    for (size_t r = 0; r < srets.size(); ++r) {
      const c10::IValue& mv = meta_stack[r];
      if (mv.isTensor() && !mv.toTensor().defined()) {
        // A gradient nobody asked for (output_mask false): the lowering may
        // compute anything here; it is dropped.
        ctx.outputs.push_back(TensorType{DType::F32, {0}});
      } else if (mv.isTensor()) {
        const at::Tensor& m = mv.toTensor();
        ctx.outputs.push_back(TensorType{device::to_dtype(m.scalar_type()), m.sizes().vec()});
      } else if (mv.isBool() || mv.isInt() || mv.isDouble()) {
        // A host scalar: the lowering computes it as a 0-d tensor.
        DType dt = mv.isBool() ? DType::Bool : mv.isInt() ? DType::I64 : DType::F64;
        ctx.outputs.push_back(TensorType{dt, {}});
      } else {
        TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: ", op_display_name(schema),
                                    " returns a value of a kind the eager executor does not handle");
      }
    }
    std::vector<Value> results = call_lowering(info, ctx);
    plan->warnings = ctx.warnings;
    plan->warnings_once = ctx.warnings_once;
    plan->read_scalar_value = ctx.scalar_value_read;
    TORCH_CHECK(results.size() == ctx.outputs.size(), "torch_pjrt: lowering of ", op_display_name(schema),
                " produced ", results.size(), " results, expected ", ctx.outputs.size());
    for (size_t r = 0; r < srets.size(); ++r) {
      const TensorType& want = ctx.outputs[r];
      const c10::IValue& mv = meta_stack[r];
      int arg = aliased_arg(r);
      plan->return_arity.push_back(-1);
      if (mv.isTensor() && !mv.toTensor().defined()) {
        ReturnPlan rp;
        rp.kind = ReturnPlan::Undefined;
        plan->returns.push_back(rp);
      } else if (mv.isInt() && std::all_of(inst.scalars.begin(), inst.scalars.end(),
                                           [](const ScalarInput& s) { return s.from_arg && !s.is_int; })) {
        // An int the Meta kernel computed without data (a size, e.g. fused
        // attention's max_q): no device read, which would wait for the queue.
        // (Meta saw no tensor values; ints returned never depend on float
        // arguments such as dropout_p.)
        ReturnPlan rp;
        rp.kind = ReturnPlan::Constant;
        rp.constant = mv;
        plan->returns.push_back(rp);
      } else if (!mv.isTensor()) {
        ReturnPlan rp;
        rp.kind = ReturnPlan::HostScalar;
        rp.type = srets[r].type();
        rp.output = static_cast<int>(program_outputs.size());
        rp.dtype = device::to_scalar_type(want.dtype);
        Value res = b.convert(results[r], want.dtype);
        program_outputs.push_back(res);
        plan->returns.push_back(rp);
      } else if (arg >= 0) {
        ReturnPlan rp;
        rp.kind = ReturnPlan::Aliased;
        rp.slot = slot_of_arg(arg);
        TORCH_CHECK(rp.slot >= 0, "torch_pjrt: ", op_display_name(schema), ": aliased return without a tpu tensor");
        write_slot(rp.slot, results[r]);
        plan->returns.push_back(rp);
      } else {
        fresh_return(mv.toTensor(), results[r]);
      }
    }
    for (const auto& m : ctx.mutations) {
      int arg = -1;
      for (size_t i = 0; i < sargs.size(); ++i)
        if (sargs[i].name() == m.name) arg = static_cast<int>(i);
      // (native_batch_norm's running stats are written without a (a!) annotation.)
      TORCH_CHECK(arg >= 0, "torch_pjrt: lowering of ", op_display_name(schema), " mutates '", m.name,
                  "', which is not an argument");
      int slot = m.index < 0 ? slot_of_arg(arg) : forms[arg].elem_slots.at(m.index);
      if (slot >= 0) write_slot(slot, m.value);  // an absent optional argument is skipped
    }
    if (!ctx.checks.empty()) {
      // The device's check word in, updated with this op's checks, out.
      std::vector<std::pair<Value, int>> folded;
      for (const auto& c : ctx.checks) folded.emplace_back(c.ok, register_check(op_display_name(schema), c));
      Value word = b.param(TensorType{DType::I32, {}});
      plan->params.push_back(ParamSource{ParamSource::CheckWord});
      plan->check_output = static_cast<int>(program_outputs.size());
      program_outputs.push_back(lowering::fold_checks(b, word, folded));
    }
  }
  for (size_t s = 0; s < storage_value.size(); ++s) {
    if (!storage_value[s]) continue;
    plan->writes.push_back(Write{static_cast<int>(s), static_cast<int>(program_outputs.size()), storage_dtype[s]});
    program_outputs.push_back(*storage_value[s]);
  }
  if (!program_outputs.empty()) {
    plan->text = b.finish(program_outputs);
    plan->param_types = b.param_types();
    for (const Value& v : program_outputs) plan->output_types.push_back(v.type);
  }
  plan->f32_precision = b.used_f32_precision();
  plan->serial = next_plan_serial();
  plan->op_name = op_display_name(schema);
  return plan;
}

uint64_t next_plan_serial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace torch_pjrt::eager
