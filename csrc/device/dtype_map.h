// PyTorch dtypes <-> the lowering library's and PJRT's element types.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "lowering/types.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::device {

// The dtypes a tpu tensor can have.
inline bool is_supported_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: case c10::kByte: case c10::kChar: case c10::kShort: case c10::kInt: case c10::kLong:
    case c10::kHalf: case c10::kBFloat16: case c10::kFloat: case c10::kDouble:
    case c10::kUInt16: case c10::kUInt32: case c10::kUInt64: case c10::kComplexFloat: case c10::kComplexDouble:
    case c10::kFloat8_e4m3fn: case c10::kFloat8_e5m2: case c10::kFloat8_e4m3fnuz: case c10::kFloat8_e5m2fnuz:
      return true;
    default:
      return false;
  }
}

inline lowering::DType to_dtype(c10::ScalarType t) {
  using lowering::DType;
  switch (t) {
    case c10::kBool: return DType::Bool;
    case c10::kByte: return DType::U8;
    case c10::kChar: return DType::I8;
    case c10::kShort: return DType::I16;
    case c10::kInt: return DType::I32;
    case c10::kLong: return DType::I64;
    case c10::kHalf: return DType::F16;
    case c10::kBFloat16: return DType::BF16;
    case c10::kFloat: return DType::F32;
    case c10::kDouble: return DType::F64;
    case c10::kUInt16: return DType::U16;
    case c10::kUInt32: return DType::U32;
    case c10::kUInt64: return DType::U64;
    case c10::kComplexFloat: return DType::C64;
    case c10::kComplexDouble: return DType::C128;
    case c10::kFloat8_e4m3fn: return DType::F8E4M3FN;
    case c10::kFloat8_e5m2: return DType::F8E5M2;
    case c10::kFloat8_e4m3fnuz: return DType::F8E4M3FNUZ;
    case c10::kFloat8_e5m2fnuz: return DType::F8E5M2FNUZ;
    default:
      // NotImplementedError, as a CPU kernel without the dtype: a TypeError
      // would become NotImplemented in Tensor.__add__ and friends, and Python
      // would then report "unsupported operand type(s)" instead of this.
      TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: dtype ", t, " is not supported on device tpu");
  }
}

inline c10::ScalarType to_scalar_type(lowering::DType t) {
  using lowering::DType;
  switch (t) {
    case DType::Bool: return c10::kBool;
    case DType::U8: return c10::kByte;
    case DType::I8: return c10::kChar;
    case DType::I16: return c10::kShort;
    case DType::I32: return c10::kInt;
    case DType::I64: return c10::kLong;
    case DType::F16: return c10::kHalf;
    case DType::BF16: return c10::kBFloat16;
    case DType::F32: return c10::kFloat;
    case DType::F64: return c10::kDouble;
    case DType::U16: return c10::kUInt16;
    case DType::U32: return c10::kUInt32;
    case DType::U64: return c10::kUInt64;
    case DType::C64: return c10::kComplexFloat;
    case DType::C128: return c10::kComplexDouble;
    case DType::F8E4M3FN: return c10::kFloat8_e4m3fn;
    case DType::F8E5M2: return c10::kFloat8_e5m2;
    case DType::F8E4M3FNUZ: return c10::kFloat8_e4m3fnuz;
    case DType::F8E5M2FNUZ: return c10::kFloat8_e5m2fnuz;
  }
  return c10::kFloat;
}

inline PJRT_Buffer_Type to_pjrt(lowering::DType t) {
  using lowering::DType;
  switch (t) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::U8: return PJRT_Buffer_Type_U8;
    case DType::I8: return PJRT_Buffer_Type_S8;
    case DType::I16: return PJRT_Buffer_Type_S16;
    case DType::I32: return PJRT_Buffer_Type_S32;
    case DType::I64: return PJRT_Buffer_Type_S64;
    case DType::F16: return PJRT_Buffer_Type_F16;
    case DType::BF16: return PJRT_Buffer_Type_BF16;
    case DType::F32: return PJRT_Buffer_Type_F32;
    case DType::F64: return PJRT_Buffer_Type_F64;
    case DType::U16: return PJRT_Buffer_Type_U16;
    case DType::U32: return PJRT_Buffer_Type_U32;
    case DType::U64: return PJRT_Buffer_Type_U64;
    case DType::C64: return PJRT_Buffer_Type_C64;
    case DType::C128: return PJRT_Buffer_Type_C128;
    case DType::F8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case DType::F8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case DType::F8E4M3FNUZ: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case DType::F8E5M2FNUZ: return PJRT_Buffer_Type_F8E5M2FNUZ;
  }
  return PJRT_Buffer_Type_INVALID;
}

}  // namespace torch_pjrt::device
