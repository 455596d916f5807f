// Dropout. On a PrivateUse1 device at::dropout takes the fused path,
// native_dropout, for 0 < p < 1 in training (is_fused_kernel_acceptable); p = 0,
// p = 1 and eval are composites of existing ops. Its autograd formula calls
// native_dropout_backward.
#include <cmath>
#include <utility>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// Threefry-2x32 uniform draws, the same generator and key layout as
// ops/random.cpp (kept local: random.cpp's helpers are file-private).
Value rotl(Builder& b, const Value& x, int r) {
  Value l = b.op("stablehlo.shift_left", {x, b.splat(Scalar::from_int(r), x.type)}, x.type);
  Value h = b.op("stablehlo.shift_right_logical", {x, b.splat(Scalar::from_int(32 - r), x.type)}, x.type);
  return b.binary("or", l, h);
}

std::pair<Value, Value> threefry2x32(Builder& b, const Value& k0, const Value& k1, Value x0, Value x1) {
  static const int kRot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  Value k2 = b.binary("xor", b.binary("xor", k0, k1), b.splat(Scalar::from_int(0x1BD11BDA), k0.type));
  const Value ks[3] = {k0, k1, k2};
  x0 = b.binary("add", x0, k0);
  x1 = b.binary("add", x1, k1);
  for (int i = 0; i < 5; ++i) {
    for (int r = 0; r < 4; ++r) {
      x0 = b.binary("add", x0, x1);
      x1 = b.binary("xor", rotl(b, x1, kRot[(i % 2) * 4 + r]), x0);
    }
    x0 = b.binary("add", x0, ks[(i + 1) % 3]);
    x1 = b.binary("add", b.binary("add", x1, ks[(i + 2) % 3]), b.splat(Scalar::from_int(i + 1), x1.type));
  }
  return {x0, x1};
}

// `n` float32 values uniform in [0, 1) with 24 random bits each.
Value uniform01(LoweringContext& ctx, int64_t n) {
  Builder& b = ctx.b;
  if (!ctx.rng_state) ctx.fail("native_dropout lowering without a random state");
  int64_t m = (n + 1) / 2;
  Value w = b.bitcast_convert(*ctx.rng_state, TensorType{DType::I32, {2, 2}});
  auto word = [&](int64_t i, int64_t j) { return b.broadcast_to(b.reshape(b.slice(w, {i, j}, {i + 1, j + 1}), {}), {m}); };
  Value c0 = b.binary("add", b.iota(TensorType{DType::I32, {m}}, 0), word(1, 0));
  auto [y0, y1] = threefry2x32(b, word(0, 0), word(0, 1), c0, word(1, 1));
  Value bits = b.slice(b.concatenate({y0, y1}, 0), {0}, {n});
  bits = b.op("stablehlo.shift_right_logical", {bits, b.splat(Scalar::from_int(8), bits.type)}, bits.type);
  Value f = b.convert(bits, DType::F32);
  return b.binary("multiply", f, b.splat(Scalar::from_float(std::ldexp(1.0, -24)), f.type));
}

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
  Value u = b.reshape(uniform01(ctx, out.numel()), out.shape);
  Value keep = b.compare(Cmp::LT, u, b.splat(Scalar::from_float(1.0 - p), u.type));
  DType dt = math_dtype(out.dtype);
  Value x = b.convert(input, dt);
  double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  Value scaled = b.binary("multiply", x, b.splat(Scalar::from_float(scale), x.type));
  return {b.convert(b.select(keep, scaled, b.zeros(x.type)), out.dtype), keep};
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
