// _scaled_mm and _scaled_mm_v2: the float8 matrix product (H100's FP8 GEMM, torchao's float8
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

// The product of self and mat2 with their scales, bias and result scale.
Value scaled_product(LoweringContext& c, const Value& scale_a, const Value& scale_b,
                     const std::optional<Value>& bias, const std::optional<Value>& scale_result) {
  Builder& b = c.b;
  // (PyTorch's Meta kernel checks the scales but not this; CPU's kernel does.)
  check_matrix_product(c, c.tensor("self").shape(), c.tensor("mat2").shape(), 0);
  Value x = scaled(b, c.tensor("self"), scale_a);
  Value y = scaled(b, c.tensor("mat2"), scale_b);
  Value p = b.dot_general(x, y, {}, {}, {1}, {0}, DType::F32);
  if (bias) p = b.binary("add", p, b.broadcast_to(b.convert(*bias, DType::F32), p.shape()));
  DType out = c.out().dtype;
  if ((out == DType::F8E4M3FN || out == DType::F8E5M2) && scale_result) {
    // CPU multiplies by 1 / scale_result, computed in float32.
    Value r = b.convert(b.reshape(*scale_result, {}), DType::F32);
    r = b.binary("divide", b.splat(Scalar::from_float(1.0), r.type), r);
    p = b.binary("multiply", p, b.broadcast_to(r, p.shape()));
  }
  return b.convert(p, out);
}

std::optional<Value> optional(const LoweringContext& c, const char* name) {
  return c.has(name) ? std::optional<Value>(c.tensor(name)) : std::nullopt;
}

}  // namespace

TORCH_PJRT_LOWERING("_scaled_mm", [](LoweringContext& c) {
  // CPU's kernel decides on scale_result by out_dtype as given, bfloat16 when
  // it is not (a float8 result of a float8 self then ignores it).
  std::optional<Value> result_scale = c.has("out_dtype") ? optional(c, "scale_result") : std::nullopt;
  return std::vector<Value>{
      scaled_product(c, c.tensor("scale_a"), c.tensor("scale_b"), optional(c, "bias"), result_scale)};
});

// torch.nn.functional.scaled_mm's op: one scale per operand with a recipe
// (TensorWise 0 or RowWise 1, the same for both, as CPU's kernel takes them),
// no swizzle, contraction over self's dim 1 and mat2's dim 0.
TORCH_PJRT_LOWERING("_scaled_mm_v2", [](LoweringContext& c) {
  const Arg &sa = c.arg("scale_a"), &sb = c.arg("scale_b");
  std::vector<int64_t> ra = c.ints("recipe_a"), rb = c.ints("recipe_b");
  std::vector<int64_t> swa = c.ints("swizzle_a"), swb = c.ints("swizzle_b"), dims = c.ints("contraction_dim");
  auto no_swizzle = [](const std::vector<int64_t>& s) { return s.empty() || (s.size() == 1 && s[0] == 0); };
  bool ok = sa.tensors.size() == 1 && sb.tensors.size() == 1 && ra.size() == 1 && rb.size() == 1 &&
            ra[0] == rb[0] && (ra[0] == 0 || ra[0] == 1) && no_swizzle(swa) && no_swizzle(swb) &&
            (dims.empty() || dims == std::vector<int64_t>{1, 0});
  if (!ok)
    c.fail("Invalid scaling configuration: tpu takes one TensorWise or RowWise scale per operand (the same recipe "
           "for both), no swizzle, as PyTorch's CPU kernel does");
  return std::vector<Value>{scaled_product(c, sa.tensors[0], sb.tensors[0], optional(c, "bias"), std::nullopt)};
});

}  // namespace torch_pjrt::lowering::ops
