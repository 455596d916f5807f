// Layer normalization backward (the forward, native_layer_norm, is in
// normalization.cpp). Math in float32 for half inputs, as PyTorch's CPU kernel.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<bool> output_mask(const LoweringContext& ctx) {
  const Arg* a = ctx.find("output_mask");
  if (a && a->kind == Arg::IntList && a->ints.size() == 3) return {a->ints[0] != 0, a->ints[1] != 0, a->ints[2] != 0};
  return {true, true, true};
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?,
// bias?, output_mask) -> (grad_input, grad_weight, grad_bias). With x_hat = (x - mean)
// * rstd and g = dy * w: grad_input = rstd / N * (N g - sum(g) - x_hat sum(g x_hat)),
// sums over the normalized dims; grad_weight = sum(dy x_hat), grad_bias = sum(dy) over
// the outer dims.
std::vector<Value> native_layer_norm_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  const Shape& shape = input.shape();
  int64_t rank = input.rank();
  int64_t axis = rank - static_cast<int64_t>(ctx.ints("normalized_shape").size());
  DType acc = is_float(input.dtype()) && itemsize(input.dtype()) < 4 ? DType::F32 : input.dtype();
  std::vector<int64_t> inner, outer;
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (d >= axis) {
      inner.push_back(d);
      n *= shape[d];
    } else {
      outer.push_back(d);
    }
  }
  Shape inner_shape(shape.begin() + axis, shape.end());
  Shape kept = shape;  // the normalized dims as size 1, like mean and rstd
  for (int64_t d : inner) kept[d] = 1;
  Value zero = b.constant(0.0, acc);
  auto sum_inner = [&](const Value& v) { return b.broadcast_to(b.reshape(b.reduce(v, zero, inner, "stablehlo.add"), kept), shape); };
  auto sum_outer = [&](const Value& v) { return outer.empty() ? v : b.reduce(v, zero, outer, "stablehlo.add"); };

  Value x = b.convert(input, acc);
  Value dy = b.convert(ctx.tensor("grad_out"), acc);
  Value mean = b.broadcast_to(b.reshape(b.convert(ctx.tensor("mean"), acc), kept), shape);
  Value rstd = b.broadcast_to(b.reshape(b.convert(ctx.tensor("rstd"), acc), kept), shape);
  Value x_hat = b.binary("multiply", b.binary("subtract", x, mean), rstd);
  Value g = dy;
  if (ctx.has("weight")) g = b.binary("multiply", dy, b.broadcast_to(b.convert(ctx.tensor("weight"), acc), shape));
  Value nv = b.splat(Scalar::from_float(double(n)), TensorType{acc, shape});
  Value inner_term = b.binary("subtract", b.binary("subtract", b.binary("multiply", g, nv), sum_inner(g)),
                              b.binary("multiply", x_hat, sum_inner(b.binary("multiply", g, x_hat))));
  Value dx = b.binary("multiply", b.binary("divide", rstd, nv), inner_term);

  std::vector<bool> mask = output_mask(ctx);
  bool all = ctx.outputs.size() == 3;
  std::vector<Value> r;
  if (all || mask[0]) r.push_back(dx);
  if (all || mask[1]) {
    if (ctx.has("weight")) r.push_back(sum_outer(b.binary("multiply", dy, x_hat)));
    else r.push_back(b.zeros(TensorType{acc, inner_shape}));  // only reached when PyTorch ignores it
  }
  if (all || mask[2]) {
    if (ctx.has("bias")) r.push_back(sum_outer(dy));
    else r.push_back(b.zeros(TensorType{acc, inner_shape}));
  }
  return r;
}

}  // namespace

TORCH_PJRT_LOWERING("native_layer_norm_backward", native_layer_norm_backward);

}  // namespace torch_pjrt::lowering::ops
