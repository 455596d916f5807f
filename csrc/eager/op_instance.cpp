#include "eager/op_instance.h"

#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "device/dtype_map.h"
#include "eager/env.h"
#include "eager/plan.h"

namespace torch_pjrt::eager {

using device::StorageBuffer;
using lowering::DType;

lowering::StridedView view_of(const at::Tensor& t) {
  return lowering::StridedView{t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

std::string op_display_name(const c10::FunctionSchema& schema) {
  std::string n = schema.name();
  if (!schema.overload_name().empty()) n += "." + schema.overload_name();
  return n;
}

bool runtime_ints_enabled() {
  static const bool on = env_choice("TORCH_PJRT_RUNTIME_INTS", "on", {"on", "off"}) == "on";
  return on;
}

bool exact_in_pack(int64_t v) {
  int64_t limit = scalar_pack_dtype() == DType::F32 ? (int64_t{1} << 24) : (int64_t{1} << 53);
  return v >= -limit && v <= limit;
}

bool runtime_int_arg(const c10::Argument& a, int64_t v) {
  const c10::Type* t = a.real_type().get();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType().get();
  if (t->kind() != c10::TypeKind::NumberType || !runtime_ints_enabled()) return false;
  const auto& dflt = a.default_value();
  if (dflt && dflt->isInt() && dflt->toInt() == v) return false;
  return exact_in_pack(v);
}

bool runtime_int_scalar(c10::ScalarType t, const c10::Scalar& v) {
  if (!runtime_ints_enabled()) return false;
  switch (t) {
    case c10::kLong: case c10::kInt: case c10::kShort: case c10::kChar: case c10::kByte:
      return v.isIntegral(false) && exact_in_pack(v.toLong());
    default:
      return false;
  }
}

bool is_write(const c10::Argument& a) { return a.alias_info() && a.alias_info()->isWrite(); }

namespace {

[[noreturn]] void device_mismatch(const std::string& a, const std::string& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              a, " and ", b, "!");
}

}  // namespace

std::string tpu_name(int index) { return "tpu:" + std::to_string(index); }

bool is_scalar_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  auto ref = v.toListRef();
  return !ref.empty() && !v.isIntList() && !v.isBoolList() &&
         (ref[0].isDouble() || ref[0].isInt() || ref[0].isBool() || ref[0].isComplexDouble() ||
          is_uint64_scalar(ref[0]));
}

namespace {

void push_complex(OpInstance& inst, c10::complex<double> z) {
  inst.scalars.push_back(ScalarInput{z.real(), false});
  inst.scalars.push_back(ScalarInput{z.imag(), false});
}

// A 0-d CPU tensor's value (a wrapped Python number, mostly), read in place
// for the common dtypes: item() goes through the dispatcher, per op call.
c10::Scalar cpu_scalar(const at::Tensor& t) {
  if (!t.is_neg() && !t.is_conj()) {
    switch (t.scalar_type()) {
      case at::kDouble: return *t.const_data_ptr<double>();
      case at::kFloat: return static_cast<double>(*t.const_data_ptr<float>());
      case at::kLong: return *t.const_data_ptr<int64_t>();
      case at::kInt: return static_cast<int64_t>(*t.const_data_ptr<int32_t>());
      case at::kBool: return *t.const_data_ptr<bool>();
      default: break;
    }
  }
  return t.item();
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
    // A CPU float scalar is always a runtime input: no recompile per value
    // (a complex one as two: its real and imaginary parts).
    bool is_float = c10::isFloatingType(t.scalar_type());
    bool is_complex = c10::isComplexType(t.scalar_type());
    auto record = [&](const c10::Scalar& v) {
      if (is_complex) push_complex(inst, v.toComplexDouble());
      else if (is_float) inst.scalars.push_back(ScalarInput{v.toDouble(), false});
      else inst.put(int_scalar(v).i);  // (the scalar type, keyed above, tells uint64 bits apart)
    };
    if (t.dim() == 0) {
      c10::Scalar v = cpu_scalar(t);  // the common case (x * 0.5): one read, no reshape
      // An integer one (x + n): a runtime input too, marked apart from a keyed value.
      bool runtime_int = runtime_int_scalar(t.scalar_type(), v);
      if (!is_float && !is_complex) inst.put(runtime_int ? 'r' : 'k');
      if (runtime_int) inst.scalars.push_back(ScalarInput{static_cast<double>(v.toLong()), false, arg_index, true});
      else record(v);
    } else {
      at::Tensor flat = t.reshape({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) record(flat[i].item());
    }
    return;
  }
  int dev = t.device().index();
  if (inst.device < 0) inst.device = dev;
  else if (inst.device != dev) device_mismatch(tpu_name(inst.device), tpu_name(dev));
  StorageBuffer& sb = device::storage_of(t);
  DType dt = device::to_dtype(t.scalar_type());
  // (Never written: no buffer, zeros inside the program, keyed by the -1
  // below. Owed by a fused trace: a value of the trace.)
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
  // The storage offset is a runtime input (plan.h, ParamSource::Offsets): one
  // program for every offset. Whether the view is its whole storage (then
  // offset 0) is decided by sizes, strides and the storage size for any valid
  // view; it is keyed anyway, as the program differs.
  inst.put(static_cast<char>(lowering::covers_whole(t.sizes().data(), t.strides().data(), t.dim(), t.storage_offset(),
                                                    static_cast<int64_t>(sb.nbytes) / lowering::itemsize(dt))));
  inst.put(static_cast<int64_t>(sb.nbytes));
  inst.put(static_cast<char>(sb.buffer || sb.pending >= 0 ? static_cast<int>(sb.dtype) : -1));
  inst.put(static_cast<int64_t>(storage));
}

// A tpu generator passed to a call on CPU tensors (torch.randperm(5,
// generator=g) dispatches here for the generator's key).
bool tpu_generator_on_cpu_call(c10::ArrayRef<c10::IValue> args) {
  bool generator = false;
  for (const c10::IValue& v : args) {
    if (v.isGenerator() && v.toGenerator().defined())
      generator |= v.toGenerator().device().type() == c10::DeviceType::PrivateUse1;
    else if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      return false;
    else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1)
      return false;
  }
  return generator;
}

void describe_args(OpInstance& inst, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  // The operator, by its schema's address (unique and fixed in the process;
  // these keys never leave it): no string per call.
  inst.put(static_cast<int64_t>(reinterpret_cast<intptr_t>(&schema)));
  inst.put(static_cast<char>(checks_enabled()));  // programs with and without value checks differ
  // Result dtypes follow the default dtype (int / int, int * 1.5, sqrt(int)):
  // a plan made under float32 must not serve float64.
  inst.put(static_cast<char>(c10::typeMetaToScalarType(c10::get_default_dtype())));
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
      if (runtime_int_arg(sargs[i], v.toInt())) {
        inst.put('j');
        inst.put_scalar_arg(static_cast<double>(v.toInt()), ai, /*is_int=*/true);
      } else {
        inst.put('i');
        inst.put(v.toInt());
      }
    } else if (is_uint64_scalar(v)) {
      inst.put('u');
      inst.put(static_cast<int64_t>(v.toUInt()));
    } else if (v.isDouble()) {
      inst.put('d');
      inst.put_scalar_arg(v.toDouble(), ai);
    } else if (v.isIntList()) {
      inst.put('l');
      inst.put(v.toIntVector());
    } else if (v.isBoolList()) {
      inst.put('B');
      for (bool e : v.toBoolList()) inst.put(static_cast<char>(e));
    } else if (v.isDoubleList()) {
      inst.put('f');
      for (double d : v.toDoubleVector()) inst.put_raw(&d, sizeof(d));
    } else if (is_scalar_list(v)) {
      inst.put('S');
      for (const auto& e : v.toListRef()) {
        if (e.isDouble() && inst.foreach) inst.put_scalar_arg(e.toDouble());
        else if (e.isDouble()) { double d = e.toDouble(); inst.put_raw(&d, sizeof(d)); }
        else if (is_uint64_scalar(e)) { inst.put('u'); inst.put(static_cast<int64_t>(e.toUInt())); }
        else if (e.isBool()) { inst.put('b'); inst.put(static_cast<int64_t>(e.toBool())); }
        else if (e.isInt()) inst.put(e.toInt());
        else TORCH_CHECK_TYPE(false, "torch_pjrt: complex scalars are not supported (", schema.name(), ")");
      }
    } else if (v.isString()) {
      inst.put('s');
      inst.put(v.toStringRef());
    } else if (v.isComplexDouble()) {  // runtime inputs, as a CPU complex scalar tensor's
      inst.put('c');
      push_complex(inst, v.toComplexDouble());
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

}  // namespace

void describe(OpInstance& inst, const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
  try {
    describe_args(inst, schema, args);
  } catch (const c10::Error&) {
    // CPU's message (CPU kernels take CPU generators) over the device mismatch.
    TORCH_CHECK(!tpu_generator_on_cpu_call(args), "Expected a 'cpu' device type for generator but found 'tpu'");
    throw;
  }
}

}  // namespace torch_pjrt::eager
