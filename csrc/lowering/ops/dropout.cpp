// Dropout. On a PrivateUse1 device at::dropout takes the fused path,
// native_dropout, for 0 < p < 1 in training (is_fused_kernel_acceptable); p = 0,
// p = 1 and eval are composites of existing ops. Its autograd formula calls
// native_dropout_backward.
#include <cmath>
#include <utility>

#include "lowering/ops/common.h"
#include "lowering/ops/random_bits.h"

namespace torch_pjrt::lowering::ops {
namespace {

// native_dropout(input, p, train?) -> (output, mask): in training each element is
// kept with probability 1 - p (the mask) and scaled by 1 / (1 - p); p = 1 drops
// everything. train = false (or None meaning true) as on CPU: eval returns the
// input and an all-true mask.
std::vector<Value> native_dropout(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  const TensorType& out = ctx.out(0);
  TensorType mask_type = ctx.out(1);
  bool train = !ctx.has("train") || ctx.to_bool("train", true);
  if (!train || out.numel() == 0) return {input, b.splat(Scalar::from_bool(true), mask_type)};
  // p is structural (a module constant): the keep threshold and the scale are exact
  // compile-time constants, 1 / (1 - p) computed in double as PyTorch does.
  double p = ctx.to_double("p", 0.5);
  if (p < 0 || p > 1)
    ctx.fail("dropout probability has to be between 0 and 1, but got " + std::to_string(p));
  if (!is_float(out.dtype)) ctx.fail("result type Float can't be cast to the desired output type");
  Value u = b.reshape(uniform01(b, *ctx.rng_state, out.numel()), out.shape);
  Value keep = b.compare(Cmp::LT, u, b.splat(Scalar::from_float(1.0 - p), u.type));
  DType dt = math_dtype(out.dtype);
  Value x = b.convert(input, dt);
  double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  // input * mask * scale, as CPU's kernel: a dropped NaN or inf stays NaN
  // (a select would give 0).
  Value masked = b.binary("multiply", x, b.convert(keep, dt));
  Value scaled = b.binary("multiply", masked, b.splat(Scalar::from_float(scale), x.type));
  return {b.convert(scaled, out.dtype), keep};
}

// native_dropout_backward(grad_output, mask, scale) = grad_output * mask * scale.
std::vector<Value> native_dropout_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  Value g = operand_as(ctx, "grad_output", dt, shape);
  Value m = operand_as(ctx, "mask", dt, shape);
  Value scale = operand_as(ctx, "scale", dt, shape);
  return {b.convert(b.binary("multiply", b.binary("multiply", g, m), scale), out)};
}

}  // namespace

TORCH_PJRT_LOWERING("native_dropout", native_dropout, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("native_dropout_backward", native_dropout_backward);

}  // namespace torch_pjrt::lowering::ops
