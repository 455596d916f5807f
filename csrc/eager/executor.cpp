#include "eager/executor.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
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

// A runtime scalar input: a float CPU 0-d tensor (often a wrapped Python
// number), a float argument, or an element of a _foreach_ scalar list.
struct ScalarInput {
  double value;
  bool from_float_arg;  // a `float`/`Scalar` argument (runtime only in dynamic mode)
};

struct OpInstance {
  std::vector<Slot> slots;
  std::vector<StorageBuffer*> storages;  // distinct storages, in first-seen order
  int device = -1;
  bool foreach = false;    // _foreach_*: the element op, once per list index, in one program
  std::string key_static;  // float arguments keyed by value
  std::string key_dynamic; // float arguments as runtime inputs
  std::vector<ScalarInput> scalars;

  void put_both(const void* p, size_t n) {
    key_static.append(static_cast<const char*>(p), n);
    key_dynamic.append(static_cast<const char*>(p), n);
  }
  void put(int64_t v) { put_both(&v, sizeof(v)); }
  void put(char c) { put_both(&c, 1); }
  void put(c10::IntArrayRef a) {
    put(static_cast<int64_t>(a.size()));
    for (auto v : a) put(v);
  }
  void put(const std::string& s) { put_both(s.data(), s.size()); put('\0'); }
  // A float that is a runtime input in dynamic mode, part of the key otherwise.
  void put_float_arg(double d) {
    key_static.append(reinterpret_cast<const char*>(&d), sizeof(d));
    key_dynamic.push_back('~');
    scalars.push_back(ScalarInput{d, true});
  }
};

bool is_write(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

[[noreturn]] void device_mismatch(const std::string& a, const std::string& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              a, " and ", b, "!");
}

std::string tpu_name(int index) { return "tpu:" + std::to_string(index); }

bool is_scalar_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  auto ref = v.toListRef();
  return !ref.empty() && (ref[0].isDouble() || ref[0].isInt()) && !v.isIntList();
}

void add_tensor(OpInstance& inst, const at::Tensor& t, int arg_index, bool pure_output) {
  if (!t.defined()) {
    inst.put('U');
    return;
  }
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    // _foreach_*.Tensor ops take their per-element scalars as a 1-d CPU tensor.
    bool scalar_vector = inst.foreach && t.device().is_cpu() && t.dim() == 1 && !pure_output;
    TORCH_CHECK(t.device().is_cpu() && (t.dim() == 0 || scalar_vector) && !pure_output,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                inst.device >= 0 ? tpu_name(inst.device) : std::string("tpu"), " and ", t.device(), "!");
    inst.put('C');
    inst.put(static_cast<char>(t.scalar_type()));
    inst.put(static_cast<char>(t.unsafeGetTensorImpl()->is_wrapped_number()));
    inst.put(static_cast<int64_t>(t.numel()));
    at::Tensor flat = t.reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      if (c10::isFloatingType(t.scalar_type())) {
        // A CPU float scalar is always a runtime input: no recompile per value.
        inst.scalars.push_back(ScalarInput{flat[i].item().toDouble(), false});
      } else {
        inst.put(flat[i].item().toLong());
      }
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
  inst.put('T');
  inst.put(static_cast<char>(dt));
  inst.put(t.sizes());
  inst.put(t.strides());
  inst.put(t.storage_offset());
  inst.put(static_cast<int64_t>(sb.nbytes));
  inst.put(static_cast<char>(sb.buffer ? static_cast<int>(sb.dtype) : -1));
  inst.put(static_cast<int64_t>(storage));
}

void describe(OpInstance& inst, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  inst.put(schema.operator_name().name + "." + schema.overload_name());
  const auto& sargs = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    bool pure_output = is_write(sargs[i]) && sargs[i].kwarg_only();
    int ai = static_cast<int>(i);
    if (v.isTensor()) {
      add_tensor(inst, v.toTensor(), ai, pure_output);
    } else if (v.isTensorList()) {
      inst.put('L');
      auto list = v.toTensorList();
      inst.put(static_cast<int64_t>(list.size()));
      for (const at::Tensor& t : list) add_tensor(inst, t, ai, pure_output);
    } else if (v.isList() && v.toListRef().size() > 0 &&
               (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
      inst.put('O');
      for (const auto& e : v.toListRef()) add_tensor(inst, e.isNone() ? at::Tensor() : e.toTensor(), ai, false);
    } else if (v.isNone()) {
      inst.put('N');
    } else if (v.isBool()) {
      inst.put('b');
      inst.put(static_cast<int64_t>(v.toBool()));
    } else if (v.isInt()) {
      inst.put('i');
      inst.put(v.toInt());
    } else if (v.isDouble()) {
      inst.put('d');
      inst.put_float_arg(v.toDouble());
    } else if (v.isIntList()) {
      inst.put('l');
      inst.put(v.toIntVector());
    } else if (v.isBoolList()) {
      inst.put('B');
      for (bool e : v.toBoolList()) inst.put(static_cast<char>(e));
    } else if (v.isDoubleList()) {
      inst.put('f');
      for (double d : v.toDoubleVector()) inst.put_both(&d, sizeof(d));
    } else if (is_scalar_list(v)) {
      inst.put('S');
      for (const auto& e : v.toListRef()) {
        if (e.isDouble() && inst.foreach) inst.put_float_arg(e.toDouble());
        else if (e.isDouble()) { double d = e.toDouble(); inst.put_both(&d, sizeof(d)); }
        else inst.put(e.toInt());
      }
    } else if (v.isString()) {
      inst.put('s');
      inst.put(v.toStringRef());
    } else if (v.isScalar()) {  // complex
      TORCH_CHECK_TYPE(false, "torch_pjrt: complex scalars are not supported (", schema.name(), ")");
    } else if (v.isDevice()) {
      inst.put('D');
      if (v.toDevice().type() == c10::DeviceType::PrivateUse1 && inst.device < 0)
        inst.device = v.toDevice().has_index() ? v.toDevice().index() : -1;
    } else if (v.isGenerator()) {
      inst.put('G');  // the key comes in as a program input
    } else {
      // Layout, MemoryFormat and other enums arrive as ints above; anything
      // else is keyed by its printed form.
      std::ostringstream os;
      os << v;
      inst.put('?');
      inst.put(os.str());
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
  DType dtype;
};

struct Resize {
  int slot;
  std::vector<int64_t> sizes;
};

// Where each program parameter comes from at run time.
struct ParamSource {
  enum Kind : char { Storage, Rng, Scalars } kind;
  int storage = -1;
  DType dtype = DType::F32;
};

struct Plan {
  runtime::ExecutablePtr exe;
  std::string text;
  std::vector<ParamSource> params;
  bool dynamic_floats = false;  // float arguments are in the scalar input
  std::vector<ReturnPlan> returns;
  std::vector<int> return_arity;  // per schema return: -1 one value, n: a list of n
  std::vector<Write> writes;
  std::vector<Resize> resizes;
  bool read_scalar_value = false;  // the lowering used a runtime scalar's value
  std::vector<std::pair<int, std::string>> checks;  // debug mode: (bool output, message)
};

std::mutex g_cache_mutex;
// Leaked on purpose: executables must not be destroyed after the plugin at exit.
auto& g_cache = *new std::unordered_map<std::string, std::shared_ptr<Plan>>();

std::shared_ptr<Plan> cache_find(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto it = g_cache.find(key);
  return it == g_cache.end() ? nullptr : it->second;
}

void cache_put(const std::string& key, std::shared_ptr<Plan> plan) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  g_cache[key] = std::move(plan);
}

// Runtime scalars travel as f64, except on TPUs, which have no f64 (there a
// float64 op's scalar is rounded to f32; f32 and narrower ops are unaffected).
DType scalar_pack_dtype() {
  static DType dt = rt().info().platform == "tpu" ? DType::F32 : DType::F64;
  return dt;
}

// Per op overload: may float arguments be runtime inputs? Learned from the
// first build: a lowering that reads a float's value makes it keyed by value.
enum class FloatMode : char { Unknown, Dynamic, Static };
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

// PyTorch's own shape, dtype and error checks, on meta tensors; out= tensors
// are resized to what the meta kernel made of them.
torch::jit::Stack run_meta(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                           OpInstance& inst, std::vector<Resize>* resizes) {
  const auto& sargs = op.schema().arguments();
  torch::jit::Stack meta_stack;
  for (const auto& v : args) meta_stack.push_back(to_meta(v));
  std::vector<c10::IValue> meta_args(meta_stack.begin(), meta_stack.end());
  if (op.schema().returns().empty() && !op.hasKernelForDispatchKey(c10::DispatchKey::Meta) &&
      !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
    // Nothing to infer (e.g. _fused_sgd_ has no Meta kernel): the lowering
    // checks its own arguments.
    return {};
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&meta_stack);
  }
  for (size_t i = 0; i < sargs.size(); ++i) {
    if (!is_write(sargs[i]) || !meta_args[i].isTensor()) continue;
    int s = -1;
    for (size_t k = 0; k < inst.slots.size(); ++k)
      if (inst.slots[k].arg_index == static_cast<int>(i)) s = static_cast<int>(k);
    if (s < 0) continue;
    const at::Tensor& m = meta_args[i].toTensor();
    if (m.sizes() != inst.slots[s].tensor.sizes()) {
      resizes->push_back(Resize{s, m.sizes().vec()});
      inst.slots[s].tensor.resize_(m.sizes());
      // Growing swaps in a new storage.
      inst.storages[inst.slots[s].storage] = &device::storage_of(inst.slots[s].tensor);
    }
  }
  return meta_stack;
}

// _foreach_ ops run their element op; argument names the element op knows.
const std::vector<std::pair<std::string, std::vector<std::string>>>& foreach_aliases() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> aliases = {
      {"scalar", {"other", "value", "min", "max"}},
      {"scalars", {"other", "value", "min", "max"}},
      {"tensors1", {"end"}},
      {"weights", {"weight"}},
  };
  return aliases;
}

bool debug_mode() {
  static bool debug = [] {
    const char* v = std::getenv("TORCH_PJRT_EAGER");
    std::string mode = v ? v : "async";
    TORCH_CHECK(mode == "async" || mode == "debug" || mode.empty(),
                "torch_pjrt: TORCH_PJRT_EAGER must be 'async' or 'debug', got '", mode, "'");
    return mode == "debug";
  }();
  return debug;
}

// Runs a lowering; a dimension or index out of range (std::out_of_range, as
// wrap_dim throws) becomes PyTorch's IndexError, as on CPU.
std::vector<Value> call_lowering(const lowering::LoweringInfo& info, lowering::LoweringContext& ctx) {
  try {
    return info.fn(ctx);
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  }
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
  // Runtime scalars, one vector parameter (scalar_pack_dtype).
  std::optional<Value> scalar_pack;
  int64_t n_scalars = 0;
  for (const auto& s : inst.scalars) n_scalars += (!s.from_float_arg || dynamic_floats);
  if (n_scalars > 0) {
    scalar_pack = b.param(TensorType{scalar_pack_dtype(), {n_scalars}});
    plan->params.push_back(ParamSource{ParamSource::Scalars});
  }
  size_t scalar_cursor = 0;  // into inst.scalars
  int64_t pack_cursor = 0;   // into the pack
  // The next entry of inst.scalars: a runtime value, or nullopt when keyed by value.
  auto next_scalar = [&]() -> std::optional<Value> {
    const ScalarInput& s = inst.scalars.at(scalar_cursor++);
    if (s.from_float_arg && !dynamic_floats) return std::nullopt;
    int64_t k = pack_cursor++;
    return b.reshape(b.slice(*scalar_pack, {k}, {k + 1}), {});
  };

  std::vector<std::optional<Value>> storage_param(inst.storages.size());
  auto param_for = [&](int storage) -> Value {
    if (!storage_param[storage]) {
      StorageBuffer* sb = inst.storages[storage];
      storage_param[storage] = b.param(TensorType{sb->dtype, {sb->numel()}});
      plan->params.push_back(ParamSource{ParamSource::Storage, storage, sb->dtype});
    }
    return *storage_param[storage];
  };
  auto read_slot = [&](const Slot& s) -> Value {
    DType dt = device::to_dtype(s.tensor.scalar_type());
    if (s.tensor.numel() == 0) return b.zeros(TensorType{dt, s.tensor.sizes().vec()});
    Value flat = lowering::reinterpret_flat(b, param_for(s.storage), dt);
    return lowering::read_strided(b, flat, view_of(s.tensor));
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
      if (c10::isFloatingType(t.scalar_type())) {
        a->tensor = b.convert(*next_scalar(), dt);
      } else {
        a->tensor = b.constant(lowering::Scalar::from_int(t.item().toLong()), dt);
      }
      return;
    }
    int s = static_cast<int>(slot_cursor++);
    if (slot_out) *slot_out = s;
    if (pure_output) return;
    a->kind = Arg::Tensor;
    a->tensor = read_slot(inst.slots[s]);
  };
  auto scalar_arg = [&](const c10::IValue& v, Arg* a) {
    if (v.isDouble()) {
      a->kind = Arg::Float;
      a->scalar = lowering::Scalar::from_float(v.toDouble());
      a->dynamic = next_scalar();
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
                          : b.constant(lowering::Scalar::from_int(t[e].item().toLong()), dt);
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
      }
    } else if (v.isDouble()) {
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
        a.floats.push_back(e.isDouble() ? e.toDouble() : static_cast<double>(e.toInt()));
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
    at::assert_no_internal_overlap(s.tensor);
    StorageBuffer* sb = inst.storages[s.storage];
    StridedView view = view_of(s.tensor);
    if (s.tensor.numel() == 0) return;
    int64_t storage_numel = static_cast<int64_t>(sb->nbytes) / lowering::itemsize(dt);
    Value flat;
    if (!storage_value[s.storage] && view.covers_whole(storage_numel) &&
        sb->nbytes % lowering::itemsize(dt) == 0) {
      flat = b.reshape(res, {storage_numel});
    } else {
      // Never written: zeros give the partial write a base.
      if (!storage_value[s.storage] && !sb->buffer) device::ensure_buffer(*sb, dt);
      Value base = storage_value[s.storage] ? *storage_value[s.storage] : param_for(s.storage);
      flat = lowering::write_strided(b, lowering::reinterpret_flat(b, base, dt), res, view);
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
    if (is_dense_permutation(m.sizes(), m.strides(), &perm)) {
      rp.strides = m.strides().vec();
      res = b.transpose(res, perm);
    } else {
      auto cs = c10::contiguous_strides(m.sizes());
      rp.strides.assign(cs.begin(), cs.end());
    }
    rp.output = static_cast<int>(program_outputs.size());
    program_outputs.push_back(b.reshape(res, {m.numel()}));
    plan->returns.push_back(rp);
  };

  if (inst.foreach) {
    // One element op per list index, all in this program.
    size_t n = 0;
    for (const auto& f : forms)
      if (f.per_element) { n = f.elems.size(); break; }
    bool inplace = srets.empty();
    TORCH_CHECK(inplace || (srets.size() == 1 && meta_stack[0].isTensorList()),
                "torch_pjrt: ", op_display_name(schema), ": unexpected returns for a _foreach_ op");
    std::vector<at::Tensor> metas;
    if (!inplace) for (const at::Tensor& t : meta_stack[0].toTensorList()) metas.push_back(t);
    for (size_t e = 0; e < n; ++e) {
      lowering::LoweringContext ctx{b, base, overload, {}, {}, rng_state};
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
      int self_slot = forms[0].elem_slots.at(e);
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
    plan->return_arity.push_back(inplace ? 0 : static_cast<int>(n));
    if (inplace) plan->return_arity.clear();
  } else {
    lowering::LoweringContext ctx{b, base, overload, {}, {}, rng_state};
    ctx.checks_enabled = debug_mode();
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
                                           [](const ScalarInput& s) { return s.from_float_arg; })) {
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
    for (const auto& c : ctx.checks) {
      plan->checks.emplace_back(static_cast<int>(program_outputs.size()), c.message);
      program_outputs.push_back(c.ok);
    }
  }
  for (size_t s = 0; s < storage_value.size(); ++s) {
    if (!storage_value[s]) continue;
    plan->writes.push_back(Write{static_cast<int>(s), static_cast<int>(program_outputs.size()), storage_dtype[s]});
    program_outputs.push_back(*storage_value[s]);
  }
  if (!program_outputs.empty()) plan->text = b.finish(program_outputs);
  return plan;
}

void run_plan(const Plan& plan, const c10::FunctionSchema& schema, OpInstance& inst,
              c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack, size_t nargs) {
  int device = inst.device >= 0 ? inst.device : 0;
  std::vector<runtime::BufferPtr> outputs;
  if (plan.exe) {
    std::vector<PJRT_Buffer*> params;
    std::vector<runtime::BufferPtr> keep;
    for (const ParamSource& p : plan.params) {
      switch (p.kind) {
        case ParamSource::Storage:
          params.push_back(device::ensure_buffer(*inst.storages[p.storage], p.dtype)->get());
          break;
        case ParamSource::Rng: {
          std::optional<at::Generator> gen;
          for (const auto& v : args)
            if (v.isGenerator()) gen = v.toGenerator();
          auto key = device::next_rng_key(gen, device);
          int64_t host[2] = {static_cast<int64_t>(key.first), static_cast<int64_t>(key.second)};
          keep.push_back(rt().buffer_from_host(host, PJRT_Buffer_Type_S64, {2}, device));
          params.push_back(keep.back()->get());
          break;
        }
        case ParamSource::Scalars: {
          std::vector<double> host;
          for (const auto& s : inst.scalars)
            if (!s.from_float_arg || plan.dynamic_floats) host.push_back(s.value);
          int64_t n = static_cast<int64_t>(host.size());
          if (scalar_pack_dtype() == DType::F32) {
            std::vector<float> narrow(host.begin(), host.end());
            keep.push_back(rt().buffer_from_host(narrow.data(), PJRT_Buffer_Type_F32, {n}, device));
          } else {
            keep.push_back(rt().buffer_from_host(host.data(), PJRT_Buffer_Type_F64, {n}, device));
          }
          params.push_back(keep.back()->get());
          break;
        }
      }
    }
    outputs = rt().execute(*plan.exe, params, device);
    if (debug_mode()) {
      // Wait here, so that a device error names this op (and Python's
      // traceback points at the line that called it).
      try {
        rt().synchronize(device);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "torch_pjrt: ", op_display_name(schema), " failed on ", tpu_name(device), ": ",
                    e.what());
      }
      for (const auto& [output, message] : plan.checks) {
        bool ok = true;
        rt().buffer_to_host(*outputs[output], &ok, 1);
        TORCH_CHECK_INDEX(ok, "torch_pjrt: ", op_display_name(schema), ": ", message);
      }
    }
  }
  for (const Write& w : plan.writes) {
    StorageBuffer* sb = inst.storages[w.storage];
    sb->buffer = outputs[w.output];
    sb->dtype = w.dtype;
  }
  torch::jit::drop(*stack, nargs);
  auto make_return = [&](const ReturnPlan& rp) -> c10::IValue {
    switch (rp.kind) {
      case ReturnPlan::Undefined:
        return at::Tensor();
      case ReturnPlan::Constant:
        return rp.constant;
      case ReturnPlan::Aliased:
        return inst.slots[rp.slot].tensor;
      case ReturnPlan::Fresh: {
        at::Tensor t = at::empty_strided(
            rp.sizes, rp.strides,
            at::TensorOptions().dtype(rp.dtype).device(c10::DeviceType::PrivateUse1, device));
        if (t.numel() > 0) {
          StorageBuffer& sb = device::storage_of(t);
          sb.buffer = outputs[rp.output];
          sb.dtype = device::to_dtype(rp.dtype);
        }
        return t;
      }
      case ReturnPlan::HostScalar: {
        at::Tensor host = at::empty({}, at::TensorOptions().dtype(rp.dtype));
        rt().buffer_to_host(*outputs[rp.output], host.data_ptr(), host.nbytes());
        if (rp.type->kind() == c10::TypeKind::BoolType) return host.item<bool>();
        if (rp.type->kind() == c10::TypeKind::IntType) return host.item<int64_t>();
        return host.item<double>();
      }
    }
    return c10::IValue();
  };
  size_t next = 0;
  for (int arity : plan.return_arity) {
    if (arity < 0) {
      stack->push_back(make_return(plan.returns[next++]));
    } else {
      c10::List<at::Tensor> list;
      for (int k = 0; k < arity; ++k) list.push_back(make_return(plan.returns[next++]).toTensor());
      stack->push_back(std::move(list));
    }
  }
}

std::string strip_namespace(const std::string& name) {
  auto pos = name.find("::");
  return pos == std::string::npos ? name : name.substr(pos + 2);
}

// ---- CPU fallback for ops without a lowering ----------------------------------------------

std::mutex g_fallback_mutex;
std::map<std::string, int64_t> g_fallback_counts;

bool fallback_is_error() {
  static bool error = [] {
    const char* v = std::getenv("TORCH_PJRT_FALLBACK");
    std::string mode = v ? v : "cpu";
    TORCH_CHECK(mode == "cpu" || mode == "error" || mode.empty(),
                "torch_pjrt: TORCH_PJRT_FALLBACK must be 'cpu' or 'error', got '", mode, "'");
    return mode == "error";
  }();
  return error;
}

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string name = op_display_name(op.schema());
  TORCH_CHECK_NOT_IMPLEMENTED(!fallback_is_error(), "torch_pjrt: ", name,
                              " has no lowering for device tpu (plugin '", rt().info().name,
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

}  // namespace

std::map<std::string, int64_t> cpu_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  return g_fallback_counts;
}

void lowering_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  auto args = torch::jit::last(*stack, nargs);

  std::string name = strip_namespace(schema.name());
  const std::string& overload = schema.overload_name();
  // In-place variants ("add_") reuse the functional lowering; the executor writes back.
  std::string base = name;
  if (base.size() > 1 && base.back() == '_' && base.compare(0, 2, "__") != 0) base.pop_back();
  OpInstance inst;
  std::string lookup_overload = overload;
  if (base.rfind("_foreach_", 0) == 0) {
    inst.foreach = true;
    base = base.substr(9);
    // _foreach_add.List -> add.Tensor; .Scalar/.ScalarList -> add.Scalar.
    if (overload == "List") lookup_overload = "Tensor";
    else if (overload == "ScalarList") lookup_overload = "Scalar";
  }
  const lowering::LoweringInfo* info = lowering::find_lowering(base, lookup_overload);
  if (!info) {
    run_on_cpu(op, stack);
    return;
  }

  describe(inst, schema, args);
  c10::OptionalDeviceGuard guard;
  if (inst.device >= 0)
    guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(inst.device)));

  std::string display = op_display_name(schema);
  FloatMode mode = float_mode(display);
  const std::string& key = mode == FloatMode::Dynamic ? inst.key_dynamic : inst.key_static;
  std::shared_ptr<Plan> plan = cache_find(key);
  if (plan) {
    runtime::metrics().executable_cache_hits++;
    for (const Resize& r : plan->resizes) {
      inst.slots[r.slot].tensor.resize_(r.sizes);
      inst.storages[inst.slots[r.slot].storage] = &device::storage_of(inst.slots[r.slot].tensor);
    }
  } else {
    runtime::metrics().executable_cache_misses++;
    std::vector<Resize> resizes;
    torch::jit::Stack meta = run_meta(op, args, inst, &resizes);
    bool dynamic = mode != FloatMode::Static;
    plan = lower(op, args, inst, *info, base, lookup_overload, meta, dynamic);
    if (dynamic && plan->read_scalar_value) {
      // The lowering needs float values at build time: key them by value.
      dynamic = false;
      set_float_mode(display, FloatMode::Static);
      plan = lower(op, args, inst, *info, base, lookup_overload, meta, false);
    } else if (mode == FloatMode::Unknown) {
      set_float_mode(display, FloatMode::Dynamic);
    }
    plan->resizes = std::move(resizes);
    if (!plan->text.empty()) plan->exe = compile_program(plan->text, display);
    plan->text.clear();
    cache_put(dynamic ? inst.key_dynamic : inst.key_static, plan);
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
