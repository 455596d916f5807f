// _scaled_mm: the float8 matrix product (H100's FP8 GEMM, torchao's float8
// training). Computed as PyTorch's CPU kernel does: each operand widened to
// float32 and multiplied by its scale (tensorwise: one value; rowwise:
// scale_a [M, 1], scale_b [1, N]), one float32 product, the bias added, a
// float8 result divided by scale_result, then rounded to the result dtype.
// (CPU's own kernel checks the scaling configuration: eager/cpu_check.h.)
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

Value scaled(Builder& b, const Value& m, const Value& scale) {
  Value x = b.convert(m, DType::F32);
  Value s = b.convert(scale, DType::F32);
  s = s.type.numel() == 1 ? b.broadcast_to(b.reshape(s, {}), x.shape()) : b.broadcast_to(s, x.shape());
  return b.binary("multiply", x, s);
}

}  // namespace

TORCH_PJRT_LOWERING("_scaled_mm", [](LoweringContext& c) {
  Builder& b = c.b;
  const Shape &sa = c.tensor("self").shape(), &sb = c.tensor("mat2").shape();
  // (PyTorch's Meta kernel checks the scales but not this; CPU's kernel does.)
  if (sa.size() != 2 || sb.size() != 2 || sa[1] != sb[0])
    c.fail("mat1 and mat2 shapes cannot be multiplied (" + std::to_string(sa.at(0)) + "x" + std::to_string(sa.at(1)) +
           " and " + std::to_string(sb.at(0)) + "x" + std::to_string(sb.at(1)) + ")");
  Value x = scaled(b, c.tensor("self"), c.tensor("scale_a"));
  Value y = scaled(b, c.tensor("mat2"), c.tensor("scale_b"));
  Value p = b.dot_general(x, y, {}, {}, {1}, {0}, DType::F32);
  if (c.has("bias")) p = b.binary("add", p, b.broadcast_to(b.convert(c.tensor("bias"), DType::F32), p.shape()));
  DType out = c.out().dtype;
  if ((out == DType::F8E4M3FN || out == DType::F8E5M2) && c.has("scale_result")) {
    // CPU multiplies by 1 / scale_result, computed in float32.
    Value r = b.convert(b.reshape(c.tensor("scale_result"), {}), DType::F32);
    r = b.binary("divide", b.splat(Scalar::from_float(1.0), r.type), r);
    p = b.binary("multiply", p, b.broadcast_to(r, p.shape()));
  }
  return std::vector<Value>{b.convert(p, out)};
});

}  // namespace torch_pjrt::lowering::ops
