#include "eager/executor.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <unordered_map>

#include "device/dtype_map.h"
#include "device/generator.h"
#include "device/storage.h"
#include "lowering/registry.h"
#include "lowering/strided_access.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::Arg;
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

StridedView view_of(const at::Tensor& t) {
  return StridedView{t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

// ---- key encoding: raw bytes appended to a string ---------------------------------------

void put(std::string& k, int64_t v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
void put(std::string& k, char c) { k.push_back(c); }
void put(std::string& k, c10::IntArrayRef a) {
  put(k, static_cast<int64_t>(a.size()));
  for (auto v : a) put(k, v);
}

// ---- what the op's arguments are, slot by slot ---------------------------------------------

// Every tpu tensor among the arguments (lists flattened), in order.
struct Slot {
  at::Tensor tensor;
  int arg_index;
  bool pure_output;  // a keyword-only mutable argument (out=): never read
  int storage;       // index into `storages`
};

struct OpInstance {
  std::vector<Slot> slots;
  std::vector<StorageBuffer*> storages;  // distinct storages, in first-seen order
  int device = -1;
  std::string key;
};

bool is_write(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

[[noreturn]] void device_mismatch(const std::string& a, const std::string& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              a, " and ", b, "!");
}

std::string tpu_name(int index) { return "tpu:" + std::to_string(index); }

void add_tensor(OpInstance& inst, const at::Tensor& t, int arg_index, bool pure_output) {
  std::string& k = inst.key;
  if (!t.defined()) {
    put(k, 'U');
    return;
  }
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 0 && !pure_output,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                inst.device >= 0 ? tpu_name(inst.device) : std::string("tpu"), " and ", t.device(), "!");
    // A CPU scalar (often a wrapped Python number) becomes a constant.
    put(k, 'C');
    put(k, static_cast<char>(t.scalar_type()));
    put(k, static_cast<char>(t.unsafeGetTensorImpl()->is_wrapped_number()));
    if (c10::isIntegralType(t.scalar_type(), true)) {
      put(k, t.item().toLong());
    } else {
      double v = t.item().toDouble();
      int64_t bits;
      std::memcpy(&bits, &v, 8);
      put(k, bits);
    }
    return;
  }
  int dev = t.device().index();
  if (inst.device < 0) inst.device = dev;
  else if (inst.device != dev) device_mismatch(tpu_name(inst.device), tpu_name(dev));
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  if (!pure_output && t.numel() > 0) device::ensure_buffer(sb, dt);
  int storage = -1;
  for (size_t i = 0; i < inst.storages.size(); ++i)
    if (inst.storages[i] == &sb) storage = static_cast<int>(i);
  if (storage < 0) {
    storage = static_cast<int>(inst.storages.size());
    inst.storages.push_back(&sb);
  }
  inst.slots.push_back(Slot{t, arg_index, pure_output, storage});
  put(k, 'T');
  put(k, static_cast<char>(dt));
  put(k, t.sizes());
  put(k, t.strides());
  put(k, t.storage_offset());
  put(k, static_cast<int64_t>(sb.nbytes));
  put(k, static_cast<char>(sb.buffer ? static_cast<int>(sb.dtype) : -1));
  put(k, static_cast<int64_t>(storage));
}

void describe(OpInstance& inst, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  std::string& k = inst.key;
  k = schema.operator_name().name;
  k += '.';
  k += schema.overload_name();
  k += '|';
  const auto& sargs = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    bool pure_output = is_write(sargs[i]) && sargs[i].kwarg_only();
    int ai = static_cast<int>(i);
    if (v.isTensor()) {
      add_tensor(inst, v.toTensor(), ai, pure_output);
    } else if (v.isTensorList()) {
      put(k, 'L');
      auto list = v.toTensorList();
      put(k, static_cast<int64_t>(list.size()));
      for (const at::Tensor& t : list) add_tensor(inst, t, ai, pure_output);
    } else if (v.isList() && v.toListRef().size() > 0 &&
               (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
      put(k, 'O');
      for (const auto& e : v.toListRef()) add_tensor(inst, e.isNone() ? at::Tensor() : e.toTensor(), ai, false);
    } else if (v.isNone()) {
      put(k, 'N');
    } else if (v.isBool()) {
      put(k, 'b');
      put(k, static_cast<int64_t>(v.toBool()));
    } else if (v.isInt()) {
      put(k, 'i');
      put(k, v.toInt());
    } else if (v.isDouble()) {
      put(k, 'd');
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, 8);
      put(k, bits);
    } else if (v.isIntList()) {
      put(k, 'l');
      put(k, v.toIntVector());
    } else if (v.isDoubleList()) {
      put(k, 'f');
      for (double d : v.toDoubleVector()) {
        int64_t bits;
        std::memcpy(&bits, &d, 8);
        put(k, bits);
      }
    } else if (v.isString()) {
      put(k, 's');
      k += v.toStringRef();
      put(k, '\0');
    } else if (v.isScalar()) {  // complex
      TORCH_CHECK_TYPE(false, "torch_pjrt: complex scalars are not supported (", schema.name(), ")");
    } else if (v.isDevice()) {
      put(k, 'D');
      if (v.toDevice().type() == c10::DeviceType::PrivateUse1 && inst.device < 0)
        inst.device = v.toDevice().has_index() ? v.toDevice().index() : -1;
    } else if (v.isGenerator()) {
      put(k, 'G');  // the key comes in as a program input
    } else {
      // Layout, MemoryFormat and other enums arrive as ints above; anything
      // else is keyed by its printed form.
      std::ostringstream os;
      os << v;
      put(k, '?');
      k += os.str();
      put(k, '\0');
    }
  }
}

// ---- shape inference on the meta device ---------------------------------------------------

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
  if (v.isTensor()) return conv(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(conv(t));
    return out;
  }
  if (v.isList()) {
    auto ref = v.toListRef();
    if (!ref.empty() && (ref[0].isTensor() || ref[0].isNone())) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& e : ref)
        out.push_back(e.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(conv(e.toTensor())));
      return out;
    }
  }
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
  return v;
}

// ---- the compiled plan of one op instance --------------------------------------------------

struct ReturnPlan {
  enum Kind { Fresh, Aliased, HostScalar } kind = Fresh;
  int slot = -1;                 // Aliased: which slot's tensor is returned
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
  int output = -1;               // program output index (Fresh, HostScalar)
  c10::TypePtr type;             // HostScalar: the schema return type
};

struct Write {
  int storage;  // which storage receives program output `output`
  int output;
  DType dtype;
};

struct Resize {
  int slot;
  std::vector<int64_t> sizes;
};

struct Plan {
  runtime::ExecutablePtr exe;
  std::vector<int> params;  // storage index per program parameter
  std::vector<DType> param_dtypes;
  bool needs_rng = false;
  std::vector<ReturnPlan> returns;
  std::vector<Write> writes;
  std::vector<Resize> resizes;
};

std::mutex g_cache_mutex;
std::unordered_map<std::string, std::shared_ptr<Plan>> g_cache;

std::shared_ptr<Plan> cache_find(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto it = g_cache.find(key);
  return it == g_cache.end() ? nullptr : it->second;
}

void cache_put(const std::string& key, std::shared_ptr<Plan> plan) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache[key] = std::move(plan);
}

runtime::ExecutablePtr compile_program(const std::string& text, const std::string& what) {
  if (dump_programs()) std::cerr << "[torch_pjrt] program for " << what << ":\n" << text;
  return rt().compile(text);
}

bool is_dense_permutation(c10::IntArrayRef sizes, c10::IntArrayRef strides, std::vector<int64_t>* perm) {
  std::vector<int64_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (sizes[*it] != 1 && strides[*it] != expected) return false;
    expected *= sizes[*it];
  }
  *perm = order;
  return true;
}

std::string op_display_name(const c10::FunctionSchema& schema) {
  std::string n = schema.name();
  if (!schema.overload_name().empty()) n += "." + schema.overload_name();
  return n;
}

std::shared_ptr<Plan> build_plan(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                 OpInstance& inst, const lowering::LoweringInfo& info,
                                 const std::string& base, const std::string& overload) {
  const auto& schema = op.schema();
  const auto& sargs = schema.arguments();
  const auto& srets = schema.returns();
  auto plan = std::make_shared<Plan>();
  plan->needs_rng = info.needs_rng;

  // 1. PyTorch's own shape, dtype and error checks, on meta tensors.
  torch::jit::Stack meta_stack;
  for (const auto& v : args) meta_stack.push_back(to_meta(v));
  std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&meta_stack);
  }

  // 2. Which returns alias which (mutated) argument.
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

  // Resize out= tensors to what the meta kernel made of them.
  for (size_t i = 0; i < sargs.size(); ++i) {
    if (!is_write(sargs[i]) || !meta_args[i].isTensor()) continue;
    int s = slot_of_arg(static_cast<int>(i));
    if (s < 0) continue;
    const at::Tensor& m = meta_args[i].toTensor();
    if (m.sizes() != inst.slots[s].tensor.sizes()) {
      plan->resizes.push_back(Resize{s, m.sizes().vec()});
      inst.slots[s].tensor.resize_(m.sizes());
      // Growing swaps in a new storage.
      inst.storages[inst.slots[s].storage] = &device::storage_of(inst.slots[s].tensor);
    }
  }

  // 3. The program.
  Builder b;
  std::vector<std::optional<Value>> storage_param(inst.storages.size());
  auto param_for = [&](int storage) -> Value {
    if (!storage_param[storage]) {
      StorageBuffer* sb = inst.storages[storage];
      storage_param[storage] = b.param(TensorType{sb->dtype, {sb->numel()}});
      plan->params.push_back(storage);
      plan->param_dtypes.push_back(sb->dtype);
    }
    return *storage_param[storage];
  };
  auto read_slot = [&](const Slot& s) -> Value {
    DType dt = device::to_dtype(s.tensor.scalar_type());
    if (s.tensor.numel() == 0) return b.zeros(TensorType{dt, s.tensor.sizes().vec()});
    Value flat = lowering::reinterpret_flat(b, param_for(s.storage), dt);
    return lowering::read_strided(b, flat, view_of(s.tensor));
  };

  lowering::LoweringContext ctx{b, base, overload, {}, {}, std::nullopt};
  size_t slot_cursor = 0;
  auto next_tensor_value = [&](const at::Tensor& t, bool pure_output, bool* wrapped) -> std::optional<Value> {
    *wrapped = false;
    if (!t.defined()) return std::nullopt;
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      *wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
      DType dt = device::to_dtype(t.scalar_type());
      lowering::Scalar sc = c10::isIntegralType(t.scalar_type(), true)
                                ? lowering::Scalar::from_int(t.item().toLong())
                                : lowering::Scalar::from_float(t.item().toDouble());
      return b.constant(sc, dt);
    }
    const Slot& s = inst.slots[slot_cursor++];
    if (pure_output) return std::nullopt;
    return read_slot(s);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    Arg a;
    a.name = sargs[i].name();
    bool pure_output = is_write(sargs[i]) && sargs[i].kwarg_only();
    bool wrapped = false;
    if (v.isTensor()) {
      auto val = next_tensor_value(v.toTensor(), pure_output, &wrapped);
      if (val) {
        a.kind = Arg::Tensor;
        a.tensor = *val;
        a.wrapped_number = wrapped;
      }
    } else if (v.isTensorList()) {
      a.kind = Arg::TensorList;
      for (const at::Tensor& t : v.toTensorList()) {
        auto val = next_tensor_value(t, pure_output, &wrapped);
        if (val) a.tensors.push_back(*val);
      }
    } else if (v.isList() && v.toListRef().size() > 0 &&
               (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
      a.kind = Arg::OptTensorList;
      for (const auto& e : v.toListRef())
        a.opt_tensors.push_back(next_tensor_value(e.isNone() ? at::Tensor() : e.toTensor(), false, &wrapped));
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
        a.kind = Arg::Int;
        a.scalar = lowering::Scalar::from_int(v.toInt());
      }
    } else if (v.isDouble()) {
      a.kind = Arg::Float;
      a.scalar = lowering::Scalar::from_float(v.toDouble());
    } else if (v.isIntList()) {
      a.kind = Arg::IntList;
      a.ints = v.toIntVector();
    } else if (v.isDoubleList()) {
      a.kind = Arg::FloatList;
      a.floats = v.toDoubleVector();
    } else if (v.isString()) {
      a.kind = Arg::String;
      a.str = v.toStringRef();
    } else if (!v.isNone()) {
      a.kind = Arg::Other;
    }
    ctx.args.push_back(std::move(a));
  }
  if (info.needs_rng) ctx.rng_state = b.param(TensorType{DType::I64, {2}});

  // Result types: tensor returns, from the meta results.
  std::vector<size_t> tensor_returns;
  for (size_t r = 0; r < srets.size(); ++r) {
    const c10::IValue& mv = meta_stack[r];
    if (mv.isTensor()) {
      const at::Tensor& m = mv.toTensor();
      ctx.outputs.push_back(TensorType{device::to_dtype(m.scalar_type()), m.sizes().vec()});
      tensor_returns.push_back(r);
    } else if (mv.isBool() || mv.isInt() || mv.isDouble()) {
      // A host scalar: the lowering computes it as a 0-d tensor.
      DType dt = mv.isBool() ? DType::Bool : mv.isInt() ? DType::I64 : DType::F64;
      ctx.outputs.push_back(TensorType{dt, {}});
      tensor_returns.push_back(r);
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: ", op_display_name(schema),
                                  " returns a value of a kind the eager executor does not handle");
    }
  }

  std::vector<Value> results = info.fn(ctx);
  TORCH_CHECK(results.size() == ctx.outputs.size(), "torch_pjrt: lowering of ", op_display_name(schema),
              " produced ", results.size(), " results, expected ", ctx.outputs.size());

  std::vector<Value> program_outputs;
  std::vector<std::optional<Value>> storage_value(inst.storages.size());
  std::vector<DType> storage_dtype(inst.storages.size());
  for (size_t j = 0; j < tensor_returns.size(); ++j) {
    size_t r = tensor_returns[j];
    const TensorType& want = ctx.outputs[j];
    Value res = b.convert(results[j], want.dtype);
    if (res.shape() != want.shape) res = b.broadcast_to(res, want.shape);
    ReturnPlan rp;
    const c10::IValue& mv = meta_stack[r];
    int arg = aliased_arg(r);
    if (!mv.isTensor()) {
      rp.kind = ReturnPlan::HostScalar;
      rp.type = srets[r].type();
      rp.output = static_cast<int>(program_outputs.size());
      rp.dtype = device::to_scalar_type(want.dtype);
      program_outputs.push_back(res);
    } else if (arg >= 0) {
      rp.kind = ReturnPlan::Aliased;
      rp.slot = slot_of_arg(arg);
      TORCH_CHECK(rp.slot >= 0, "torch_pjrt: ", op_display_name(schema), ": aliased return without a tpu tensor");
      const Slot& s = inst.slots[rp.slot];
      at::assert_no_internal_overlap(s.tensor);
      StorageBuffer* sb = inst.storages[s.storage];
      StridedView view = view_of(s.tensor);
      int64_t storage_numel = static_cast<int64_t>(sb->nbytes) / lowering::itemsize(want.dtype);
      Value flat;
      if (!storage_value[s.storage] && view.covers_whole(storage_numel) &&
          sb->nbytes % lowering::itemsize(want.dtype) == 0) {
        flat = b.reshape(res, {storage_numel});
      } else {
        // Never written: zeros give the partial write a base.
        if (!storage_value[s.storage] && !sb->buffer) device::ensure_buffer(*sb, want.dtype);
        Value base = storage_value[s.storage] ? *storage_value[s.storage] : param_for(s.storage);
        flat = lowering::write_strided(b, lowering::reinterpret_flat(b, base, want.dtype), res, view);
      }
      storage_value[s.storage] = flat;
      storage_dtype[s.storage] = want.dtype;
    } else {
      const at::Tensor& m = mv.toTensor();
      rp.kind = ReturnPlan::Fresh;
      rp.sizes = m.sizes().vec();
      rp.dtype = m.scalar_type();
      std::vector<int64_t> perm;
      if (is_dense_permutation(m.sizes(), m.strides(), &perm)) {
        rp.strides = m.strides().vec();
        res = b.transpose(res, perm);
      } else {
        auto cs = c10::contiguous_strides(m.sizes());
        rp.strides.assign(cs.begin(), cs.end());
      }
      rp.output = static_cast<int>(program_outputs.size());
      program_outputs.push_back(b.reshape(res, {lowering::numel(want.shape)}));
    }
    plan->returns.push_back(rp);
  }
  for (size_t s = 0; s < storage_value.size(); ++s) {
    if (!storage_value[s]) continue;
    plan->writes.push_back(Write{static_cast<int>(s), static_cast<int>(program_outputs.size()), storage_dtype[s]});
    program_outputs.push_back(*storage_value[s]);
  }
  if (program_outputs.empty()) {
    plan->exe = nullptr;  // nothing to compute (e.g. an empty tensor)
    return plan;
  }
  plan->exe = compile_program(b.finish(program_outputs), op_display_name(schema));
  return plan;
}

void run_plan(const Plan& plan, const c10::FunctionSchema& schema, OpInstance& inst,
              c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack, size_t nargs) {
  int device = inst.device >= 0 ? inst.device : 0;
  std::vector<runtime::BufferPtr> outputs;
  if (plan.exe) {
    std::vector<PJRT_Buffer*> params;
    std::vector<runtime::BufferPtr> keep;
    for (size_t p = 0; p < plan.params.size(); ++p) {
      StorageBuffer* sb = inst.storages[plan.params[p]];
      params.push_back(device::ensure_buffer(*sb, plan.param_dtypes[p])->get());
    }
    if (plan.needs_rng) {
      std::optional<at::Generator> gen;
      for (const auto& v : args)
        if (v.isGenerator()) gen = v.toGenerator();
      auto key = device::next_rng_key(gen, device);
      int64_t host[2] = {static_cast<int64_t>(key.first), static_cast<int64_t>(key.second)};
      keep.push_back(rt().buffer_from_host(host, PJRT_Buffer_Type_S64, {2}, device));
      params.push_back(keep.back()->get());
    }
    outputs = rt().execute(*plan.exe, params, device);
  }
  for (const Write& w : plan.writes) {
    StorageBuffer* sb = inst.storages[w.storage];
    sb->buffer = outputs[w.output];
    sb->dtype = w.dtype;
  }
  torch::jit::drop(*stack, nargs);
  for (const ReturnPlan& rp : plan.returns) {
    switch (rp.kind) {
      case ReturnPlan::Aliased:
        stack->push_back(inst.slots[rp.slot].tensor);
        break;
      case ReturnPlan::Fresh: {
        at::Tensor t = at::empty_strided(
            rp.sizes, rp.strides,
            at::TensorOptions().dtype(rp.dtype).device(c10::DeviceType::PrivateUse1, device));
        if (t.numel() > 0) {
          StorageBuffer& sb = device::storage_of(t);
          sb.buffer = outputs[rp.output];
          sb.dtype = device::to_dtype(rp.dtype);
        }
        stack->push_back(std::move(t));
        break;
      }
      case ReturnPlan::HostScalar: {
        at::Tensor host = at::empty({}, at::TensorOptions().dtype(rp.dtype));
        rt().buffer_to_host(*outputs[rp.output], host.data_ptr(), host.nbytes());
        if (rp.type->kind() == c10::TypeKind::BoolType) stack->push_back(host.item<bool>());
        else if (rp.type->kind() == c10::TypeKind::IntType) stack->push_back(host.item<int64_t>());
        else stack->push_back(host.item<double>());
        break;
      }
    }
  }
}

std::string strip_namespace(const std::string& name) {
  auto pos = name.find("::");
  return pos == std::string::npos ? name : name.substr(pos + 2);
}

}  // namespace

void lowering_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  auto args = torch::jit::last(*stack, nargs);

  std::string name = strip_namespace(schema.name());
  const std::string& overload = schema.overload_name();
  // In-place variants ("add_") reuse the functional lowering; the executor writes back.
  std::string base = name;
  if (base.size() > 1 && base.back() == '_' && base.compare(0, 2, "__") != 0) base.pop_back();
  const lowering::LoweringInfo* info = lowering::find_lowering(base, overload);
  if (!info) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: ", op_display_name(schema),
                                " has no lowering for device tpu (plugin '", rt().info().name,
                                "'); see torch_pjrt.supported_ops()");
  }

  OpInstance inst;
  describe(inst, schema, args);
  c10::OptionalDeviceGuard guard;
  if (inst.device >= 0)
    guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(inst.device)));

  std::shared_ptr<Plan> plan = cache_find(inst.key);
  if (plan) {
    runtime::metrics().executable_cache_hits++;
    for (const Resize& r : plan->resizes) {
      inst.slots[r.slot].tensor.resize_(r.sizes);
      inst.storages[inst.slots[r.slot].storage] = &device::storage_of(inst.slots[r.slot].tensor);
    }
  } else {
    runtime::metrics().executable_cache_misses++;
    plan = build_plan(op, args, inst, *info, base, overload);
    cache_put(inst.key, plan);
  }
  run_plan(*plan, schema, inst, args, stack, nargs);
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
  std::vector<PJRT_Buffer*> params;
  for (const auto& in : inputs) params.push_back(in->get());
  return rt().execute(*plan->exe, params, device);
}

namespace {
// Key of an internal program that reads or writes view `t` of storage `sb`.
std::string view_key(const char* what, const at::Tensor& t, const StorageBuffer& sb, DType dt) {
  std::string key = what;
  put(key, static_cast<char>(dt));
  put(key, static_cast<char>(sb.dtype));
  put(key, static_cast<int64_t>(sb.numel()));
  put(key, t.sizes());
  put(key, t.strides());
  put(key, t.storage_offset());
  return key;
}
}  // namespace

runtime::BufferPtr materialize(const at::Tensor& t) {
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  const auto& buffer = device::ensure_buffer(sb, dt);
  StridedView view = view_of(t);
  if (sb.dtype == dt && view.covers_whole(sb.numel())) return buffer;
  std::string key = view_key("$read|", t, sb, dt);
  TensorType storage_type{sb.dtype, {sb.numel()}};
  int64_t n = t.numel();
  return run_cached(key, {buffer}, sb.device, [&](Builder& b) {
    Value flat = lowering::reinterpret_flat(b, b.param(storage_type), dt);
    return std::vector<Value>{b.reshape(lowering::read_strided(b, flat, view), {n})};
  })[0];
}

void assign(const at::Tensor& t, runtime::BufferPtr values) {
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  StridedView view = view_of(t);
  at::assert_no_internal_overlap(t);
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
  auto out = run_cached(key, {base, values}, sb.device, [&](Builder& b) {
    Value flat = lowering::reinterpret_flat(b, b.param(storage_type), dt);
    Value v = b.reshape(b.param(values_type), view.sizes);
    return std::vector<Value>{lowering::write_strided(b, flat, v, view)};
  });
  sb.buffer = out[0];
  sb.dtype = dt;
}

int64_t executable_cache_size() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return static_cast<int64_t>(g_cache.size());
}

void clear_executable_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache.clear();
}

}  // namespace torch_pjrt::eager
