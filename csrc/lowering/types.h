// Element types and tensor types of the lowering library (no PyTorch here:
// the same lowerings serve eager, fused eager and torch.compile).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_pjrt::lowering {

enum class DType : uint8_t {
  Bool, U8, I8, I16, I32, I64, F16, BF16, F32, F64, U16, U32, U64, C64, C128,
  // PyTorch's float8 types (storage, conversions and data movement; arithmetic
  // runs on the CPU as PyTorch's CPU kernels allow it, _scaled_mm is lowered).
  F8E4M3FN, F8E5M2, F8E4M3FNUZ, F8E5M2FNUZ
};

const char* mlir_name(DType t);  // "f32", "i1", "ui8", ...
const char* dtype_name(DType t);  // "float32", "bool", ... (for messages)
const char* scalar_type_name(DType t);  // PyTorch's ScalarType names: "Float", "Long", ... (CPU's messages)
int64_t itemsize(DType t);
inline bool is_float8(DType t) {
  return t == DType::F8E4M3FN || t == DType::F8E5M2 || t == DType::F8E4M3FNUZ || t == DType::F8E5M2FNUZ;
}
inline bool is_float(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64 || is_float8(t);
}
inline bool is_complex(DType t) { return t == DType::C64 || t == DType::C128; }
inline bool is_integral(DType t, bool include_bool) {
  return !is_float(t) && !is_complex(t) && (include_bool || t != DType::Bool);
}
inline bool is_unsigned(DType t) {
  return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64;
}
// uint16/32/64: PyTorch's "barebones" unsigned types (few ops on CPU).
inline bool is_barebones_unsigned(DType t) { return t == DType::U16 || t == DType::U32 || t == DType::U64; }
// complex64 -> float32, complex128 -> float64; others unchanged.
inline DType real_dtype(DType t) { return t == DType::C64 ? DType::F32 : t == DType::C128 ? DType::F64 : t; }
// float32 (and narrower) -> complex64, float64 -> complex128.
inline DType complex_dtype(DType t) {
  return t == DType::F64 || t == DType::C128 ? DType::C128 : DType::C64;
}

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);

struct TensorType {
  DType dtype = DType::F32;
  Shape shape;
  std::string str() const;  // "tensor<2x3xf32>"
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return lowering::numel(shape); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// An SSA value of the program under construction.
struct Value {
  std::string id;  // "%3"
  TensorType type;
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
  int64_t rank() const { return type.rank(); }
};

// A scalar argument, exact for int64, uint64 and double.
struct Scalar {
  // UInt: a Python int in [2**63, 2**64) (PyTorch's uint64 Scalar); `i` holds
  // its bits, so converting `i` to an integer dtype wraps as a C cast does.
  enum Kind : uint8_t { Int, Float, Bool, UInt } kind = Int;
  int64_t i = 0;
  double f = 0.0;
  static Scalar from_int(int64_t v) { Scalar s; s.kind = Int; s.i = v; s.f = double(v); return s; }
  static Scalar from_float(double v) { Scalar s; s.kind = Float; s.f = v; s.i = int64_t(v); return s; }
  static Scalar from_bool(bool v) { Scalar s; s.kind = Bool; s.i = v; s.f = v; return s; }
  static Scalar from_uint(uint64_t v) { Scalar s; s.kind = UInt; s.i = int64_t(v); s.f = double(v); return s; }
  double to_double() const { return kind == Float ? f : kind == UInt ? double(uint64_t(i)) : double(i); }
  // The dtype PyTorch gives a Python number of this kind.
  DType natural_dtype() const {
    return kind == Float ? DType::F64 : kind == Bool ? DType::Bool : kind == UInt ? DType::U64 : DType::I64;
  }
};

// PyTorch's type promotion (torch.result_type): operands of higher priority
// (tensors with dims > 0-dim tensors > Python scalars) decide the dtype unless a
// lower-priority operand is of a higher category (bool < integral < float).
struct PromotionOperand {
  DType dtype;
  enum Priority : uint8_t { WrappedScalar = 0, ZeroDim = 1, Dimensioned = 2 } priority;
};
DType promote_types(DType a, DType b);
DType result_type(const std::vector<PromotionOperand>& operands, DType default_float = DType::F32);

}  // namespace torch_pjrt::lowering
