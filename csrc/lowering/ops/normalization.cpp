// Layer normalization (forward), used by transformer blocks, and weight normalization.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) ->
// (out, mean, rstd); statistics in float32 for half types, like PyTorch's CPU kernel.
std::vector<Value> native_layer_norm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  int64_t rank = input.rank();
  int64_t norm_dims = static_cast<int64_t>(ctx.ints("normalized_shape").size());
  DType acc = is_float(input.dtype()) && itemsize(input.dtype()) < 4 ? DType::F32 : input.dtype();
  Value x = b.convert(input, acc);
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int64_t d = rank - norm_dims; d < rank; ++d) {
    dims.push_back(d);
    count *= input.shape()[d];
  }
  Shape kept = ctx.out(1).shape;  // mean/rstd keep the reduced dims as size 1
  Value zero = b.constant(0.0, acc);
  Value n = b.splat(Scalar::from_float(double(count)), TensorType{acc, kept});
  Value mean = b.binary("divide", b.reshape(b.reduce(x, zero, dims, "stablehlo.add"), kept), n);
  Value centered = b.binary("subtract", x, b.broadcast_to(mean, x.shape()));
  Value sq = b.binary("multiply", centered, centered);
  Value var = b.binary("divide", b.reshape(b.reduce(sq, zero, dims, "stablehlo.add"), kept), n);
  Value eps = b.splat(Scalar::from_float(ctx.to_double("eps", 1e-5)), var.type);
  Value rstd = b.unary("rsqrt", b.binary("add", var, eps));
  Value out = b.binary("multiply", centered, b.broadcast_to(rstd, x.shape()));
  if (ctx.has("weight"))
    out = b.binary("multiply", out, b.broadcast_to(b.convert(ctx.tensor("weight"), acc), x.shape()));
  if (ctx.has("bias"))
    out = b.binary("add", out, b.broadcast_to(b.convert(ctx.tensor("bias"), acc), x.shape()));
  return {out, mean, rstd};
}

// Weight normalization (torch.nn.utils.weight_norm, parametrizations.weight_norm):
// the L2 norm of v over every dim but `dim`, shaped like g ([C, 1, ...] or
// [1, ..., C]); float32 for half types, as PyTorch's CPU kernel does.
struct WeightNorm {
  DType acc;
  std::vector<int64_t> dims;  // the reduced dims
  Shape kept;                 // v's shape with the reduced dims 1
};

WeightNorm weight_norm_dims(LoweringContext& ctx, const Value& v) {
  int64_t rank = v.rank();
  int64_t dim = rank == 0 ? 0 : wrap_dim(ctx.to_int("dim", 0), rank);
  WeightNorm w{is_float(v.dtype()) && itemsize(v.dtype()) < 4 ? DType::F32 : v.dtype(), {}, v.shape()};
  for (int64_t d = 0; d < rank; ++d) {
    if (d == dim) continue;
    w.dims.push_back(d);
    w.kept[d] = 1;
  }
  return w;
}

// g (or a saved per-slice tensor) read in w.kept's shape: its element count
// must be v's size at `dim` (the op's Meta kernel does not check it).
Value kept_tensor(LoweringContext& ctx, const std::string& name, const WeightNorm& w) {
  const Value& t = ctx.tensor(name);
  if (t.type.numel() != lowering::numel(w.kept))
    ctx.fail("weight_norm: " + name + " should have " + std::to_string(lowering::numel(w.kept)) +
             " elements (v's size at dim), got " + std::to_string(t.type.numel()));
  return ctx.b.reshape(ctx.b.convert(t, w.acc), w.kept);
}

Value sum_kept(Builder& b, const Value& x, const WeightNorm& w) {
  return b.reshape(b.reduce(x, b.constant(0.0, w.acc), w.dims, "stablehlo.add"), w.kept);
}

// _weight_norm_interface(v, g, dim) -> (w = v * g / |v|, |v|)
std::vector<Value> weight_norm_interface(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value v0 = ctx.tensor("v");
  WeightNorm w = weight_norm_dims(ctx, v0);
  Value v = b.convert(v0, w.acc);
  Value norm = b.unary("sqrt", sum_kept(b, b.binary("multiply", v, v), w));
  Value g = kept_tensor(ctx, "g", w);
  Value out = b.binary("multiply", v, b.broadcast_to(b.binary("divide", g, norm), v.shape()));
  return {b.convert(out, ctx.out(0).dtype), b.reshape(b.convert(norm, ctx.out(1).dtype), ctx.out(1).shape)};
}

// _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim) ->
// (grad_v, grad_g): grad_g = sum(grad_w * v) / norm,
// grad_v = g / norm * (grad_w - v * grad_g / norm).
std::vector<Value> weight_norm_interface_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value v0 = ctx.tensor("saved_v");
  WeightNorm w = weight_norm_dims(ctx, v0);
  Value v = b.convert(v0, w.acc);
  Value gw = b.convert(ctx.tensor("grad_w"), w.acc);
  Value g = kept_tensor(ctx, "saved_g", w);
  Value norm = kept_tensor(ctx, "saved_norms", w);
  Value grad_g = b.binary("divide", sum_kept(b, b.binary("multiply", gw, v), w), norm);
  Value shift = b.binary("multiply", v, b.broadcast_to(b.binary("divide", grad_g, norm), v.shape()));
  Value grad_v = b.binary("multiply", b.broadcast_to(b.binary("divide", g, norm), v.shape()),
                          b.binary("subtract", gw, shift));
  return {b.convert(grad_v, ctx.out(0).dtype),
          b.reshape(b.convert(grad_g, ctx.out(1).dtype), ctx.out(1).shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("native_layer_norm", native_layer_norm);
TORCH_PJRT_LOWERING("_weight_norm_interface", weight_norm_interface);
TORCH_PJRT_LOWERING("_weight_norm_interface_backward", weight_norm_interface_backward);

}  // namespace torch_pjrt::lowering::ops
