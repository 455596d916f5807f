// int8 matrix products of quantized inference (torchao's int8 dynamic and
// weight-only quantization, on any device):
//   _int_mm(a, b): int8 x int8, accumulated and returned in int32;
//   _weight_int8pack_mm(x, w, scales): x [M, K] (float) times int8 w [N, K]
//   transposed, in float32, each column times its scale, in x's dtype (as
//   CPU's kernel computes it).
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

TORCH_PJRT_LOWERING("_int_mm", [](LoweringContext& c) {
  Value a = c.tensor("self"), b = c.tensor("mat2");
  check_matrix_product(c, a.shape(), b.shape(), 0);
  if (a.dtype() != b.dtype()) {  // uint8 x int8 (CPU takes it): XLA's dot wants one operand type
    a = c.b.convert(a, DType::I32);
    b = c.b.convert(b, DType::I32);
  }
  return std::vector<Value>{c.b.dot_general(a, b, {}, {}, {1}, {0}, DType::I32)};
});

TORCH_PJRT_LOWERING("_weight_int8pack_mm", [](LoweringContext& c) {
  Builder& b = c.b;
  const Value &x = c.tensor("self"), &w = c.tensor("mat2");
  check_matrix_product(c, x.shape(), w.shape(), 1);
  Value p = b.dot_general(b.convert(x, DType::F32), b.convert(w, DType::F32), {}, {}, {1}, {1}, DType::F32);
  Value s = b.broadcast_in_dim(b.convert(c.tensor("scales"), DType::F32), p.shape(), {1});
  return std::vector<Value>{b.convert(b.binary("multiply", p, s), c.out().dtype)};
});

}  // namespace torch_pjrt::lowering::ops
