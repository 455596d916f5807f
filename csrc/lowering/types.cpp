#include "lowering/types.h"

#include <stdexcept>

namespace torch_pjrt::lowering {

const char* mlir_name(DType t) {
  switch (t) {
    case DType::Bool: return "i1";
    case DType::U8: return "ui8";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::U16: return "ui16";
    case DType::U32: return "ui32";
    case DType::U64: return "ui64";
    case DType::C64: return "complex<f32>";
    case DType::C128: return "complex<f64>";
    case DType::F8E4M3FN: return "f8E4M3FN";
    case DType::F8E5M2: return "f8E5M2";
    case DType::F8E4M3FNUZ: return "f8E4M3FNUZ";
    case DType::F8E5M2FNUZ: return "f8E5M2FNUZ";
  }
  return "?";
}

const char* scalar_type_name(DType t) {
  switch (t) {
    case DType::Bool: return "Bool";
    case DType::U8: return "Byte";
    case DType::I8: return "Char";
    case DType::I16: return "Short";
    case DType::I32: return "Int";
    case DType::I64: return "Long";
    case DType::F16: return "Half";
    case DType::BF16: return "BFloat16";
    case DType::F32: return "Float";
    case DType::F64: return "Double";
    case DType::U16: return "UInt16";
    case DType::U32: return "UInt32";
    case DType::U64: return "UInt64";
    case DType::C64: return "ComplexFloat";
    case DType::C128: return "ComplexDouble";
    case DType::F8E4M3FN: return "Float8_e4m3fn";
    case DType::F8E5M2: return "Float8_e5m2";
    case DType::F8E4M3FNUZ: return "Float8_e4m3fnuz";
    case DType::F8E5M2FNUZ: return "Float8_e5m2fnuz";
  }
  return "?";
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::C64: return "complex64";
    case DType::C128: return "complex128";
    case DType::F8E4M3FN: return "float8_e4m3fn";
    case DType::F8E5M2: return "float8_e5m2";
    case DType::F8E4M3FNUZ: return "float8_e4m3fnuz";
    case DType::F8E5M2FNUZ: return "float8_e5m2fnuz";
  }
  return "?";
}

int64_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: case DType::U8: case DType::I8: return 1;
    case DType::F8E4M3FN: case DType::F8E5M2: case DType::F8E4M3FNUZ: case DType::F8E5M2FNUZ: return 1;
    case DType::I16: case DType::F16: case DType::BF16: case DType::U16: return 2;
    case DType::I32: case DType::F32: case DType::U32: return 4;
    case DType::I64: case DType::F64: case DType::U64: case DType::C64: return 8;
    case DType::C128: return 16;
  }
  return 1;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string TensorType::str() const {
  std::string s = "tensor<";
  for (auto d : shape) s += std::to_string(d) + "x";
  s += mlir_name(dtype);
  s += ">";
  return s;
}

namespace {
int category(DType t) { return t == DType::Bool ? 0 : is_complex(t) ? 3 : is_float(t) ? 2 : 1; }
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = category(a), cb = category(b);
  if (ca == 3 || cb == 3) {
    // complex with complex or float: the complex type of the wider real part.
    DType ra = real_dtype(a), rb = real_dtype(b);
    bool wide = (ra == DType::F64 && ca >= 2) || (rb == DType::F64 && cb >= 2);
    if (ca != 3) return cb == 3 && ca < 2 ? b : complex_dtype(wide ? DType::F64 : DType::F32);
    if (cb != 3) return ca == 3 && cb < 2 ? a : complex_dtype(wide ? DType::F64 : DType::F32);
    return wide ? DType::C128 : DType::C64;
  }
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    // float16 with bfloat16 promotes to float32, as in PyTorch.
    if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16)) return DType::F32;
    return itemsize(a) >= itemsize(b) ? a : b;
  }
  // Integers: uint8 with a signed type needs the next signed width up.
  if (a == DType::U8 || b == DType::U8) {
    DType other = a == DType::U8 ? b : a;
    return other == DType::I8 ? DType::I16 : other;
  }
  return itemsize(a) >= itemsize(b) ? a : b;
}

namespace {
// PyTorch's combine_categories: the higher-priority dtype wins unless it is bool
// or the lower one is floating and the higher is not.
bool combine(bool has_hi, DType hi, bool has_lo, DType lo, DType* out) {
  if (!has_hi) { *out = lo; return has_lo; }
  if (!has_lo || is_complex(hi)) { *out = hi; return true; }
  if (is_complex(lo)) { *out = is_float(hi) ? complex_dtype(hi) : lo; return true; }
  if (is_float(hi)) { *out = hi; return true; }
  *out = (hi == DType::Bool || is_float(lo)) ? promote_types(hi, lo) : hi;
  return true;
}
}  // namespace

DType result_type(const std::vector<PromotionOperand>& operands, DType default_float) {
  bool has[3] = {false, false, false};
  DType acc[3] = {DType::Bool, DType::Bool, DType::Bool};
  for (const auto& op : operands) {
    int p = op.priority;
    DType d = op.dtype;
    // A Python float counts as the default dtype, a Python int as int64.
    if (op.priority == PromotionOperand::WrappedScalar && is_float(d)) d = default_float;
    if (op.priority == PromotionOperand::WrappedScalar && is_complex(d)) d = complex_dtype(default_float);
    acc[p] = has[p] ? promote_types(acc[p], d) : d;
    has[p] = true;
  }
  DType low;
  bool has_low = combine(has[1], acc[1], has[0], acc[0], &low);
  DType result;
  if (!combine(has[2], acc[2], has_low, low, &result))
    throw std::runtime_error("result_type: no operands");
  return result;
}

}  // namespace torch_pjrt::lowering
