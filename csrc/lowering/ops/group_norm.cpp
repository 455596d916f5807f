// Group normalization, forward and backward. native_group_norm is
// CompositeExplicitAutograd (it runs as one lowering once the executor routes
// such ops); native_group_norm_backward is what its autograd formula calls.
// Math in float32 for half inputs, as PyTorch's CPU kernels do.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

DType acc_dtype(DType t) { return is_float(t) && itemsize(t) < 4 ? DType::F32 : t; }

struct Dims {
  int64_t n, c, hxw, g, cpg;
};

Dims group_dims(LoweringContext& ctx) {
  Dims d{ctx.to_int("N", 0), ctx.to_int("C", 0), ctx.to_int("HxW", 0), ctx.to_int("group", 1), 0};
  if (d.g <= 0 || d.c % d.g != 0)
    ctx.fail("Expected number of channels in input to be divisible by num_groups, but got input of shape C=" +
             std::to_string(d.c) + " and num_groups=" + std::to_string(d.g));
  d.cpg = d.c / d.g;
  return d;
}

Value sum_over(Builder& b, const Value& x, const std::vector<int64_t>& dims) {
  return b.reduce(x, b.constant(0.0, x.dtype()), dims, "stablehlo.add");
}

// gamma (or ones) as [G, cpg] in `acc`.
Value gamma_or_ones(LoweringContext& ctx, const Dims& d, DType acc) {
  if (ctx.has("weight")) return ctx.b.reshape(ctx.b.convert(ctx.tensor("weight"), acc), {d.g, d.cpg});
  return ctx.b.splat(Scalar::from_float(1.0), TensorType{acc, {d.g, d.cpg}});
}

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd),
// mean/rstd of shape [N, group] with the biased variance.
std::vector<Value> native_group_norm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  Dims d = group_dims(ctx);
  DType acc = acc_dtype(input.dtype());
  Shape g4{d.n, d.g, d.cpg, d.hxw};
  Value x = b.reshape(b.convert(input, acc), g4);
  TensorType stat{acc, {d.n, d.g}};
  Value cnt = b.splat(Scalar::from_float(double(d.cpg * d.hxw)), stat);
  Value mean = b.binary("divide", sum_over(b, x, {2, 3}), cnt);
  Value centered = b.binary("subtract", x, b.broadcast_in_dim(mean, g4, {0, 1}));
  Value var = b.binary("divide", sum_over(b, b.binary("multiply", centered, centered), {2, 3}), cnt);
  Value eps = b.broadcast_to(ctx.operand("eps", acc), stat.shape);
  Value rstd = b.unary("rsqrt", b.binary("add", var, eps));
  Value out = b.binary("multiply", centered, b.broadcast_in_dim(rstd, g4, {0, 1}));
  if (ctx.has("weight"))
    out = b.binary("multiply", out, b.broadcast_in_dim(gamma_or_ones(ctx, d, acc), g4, {1, 2}));
  if (ctx.has("bias")) {
    Value beta = b.reshape(b.convert(ctx.tensor("bias"), acc), {d.g, d.cpg});
    out = b.binary("add", out, b.broadcast_in_dim(beta, g4, {1, 2}));
  }
  return {b.reshape(out, input.shape()), mean, rstd};
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group,
// output_mask) -> (grad_input, grad_weight, grad_bias), with PyTorch's CPU formulas:
// ds/db are per-(n, c) sums of dy*x and dy; grad_input = dy*c1 + x*c2 + c3.
std::vector<Value> native_group_norm_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  Dims d = group_dims(ctx);
  DType acc = acc_dtype(input.dtype());
  Shape g4{d.n, d.g, d.cpg, d.hxw}, g3{d.n, d.g, d.cpg};
  Value x = b.reshape(b.convert(input, acc), g4);
  Value dy = b.reshape(b.convert(ctx.tensor("grad_out"), acc), g4);
  Value mean = b.convert(ctx.tensor("mean"), acc);  // [N, G]
  Value rstd = b.convert(ctx.tensor("rstd"), acc);
  Value ds = sum_over(b, b.binary("multiply", dy, x), {3});  // [N, G, cpg]
  Value db = sum_over(b, dy, {3});
  Value gamma = gamma_or_ones(ctx, d, acc);                // [G, cpg]
  Value gamma3 = b.broadcast_in_dim(gamma, g3, {1, 2});
  Value ds_val = sum_over(b, b.binary("multiply", ds, gamma3), {2});  // [N, G]
  Value db_val = sum_over(b, b.binary("multiply", db, gamma3), {2});
  TensorType stat{acc, {d.n, d.g}};
  Value s = b.splat(Scalar::from_float(1.0 / double(d.cpg * d.hxw)), stat);
  Value rstd3 = b.binary("multiply", b.binary("multiply", rstd, rstd), rstd);
  Value c2 = b.binary("multiply", b.binary("multiply", b.binary("subtract", b.binary("multiply", db_val, mean), ds_val), rstd3), s);
  Value c3 = b.binary("subtract", b.unary("negate", b.binary("multiply", c2, mean)),
                      b.binary("multiply", b.binary("multiply", db_val, rstd), s));
  Value c1 = b.binary("multiply", b.broadcast_in_dim(rstd, g3, {0, 1}), gamma3);  // [N, G, cpg]
  Value dx = b.binary("add", b.binary("multiply", dy, b.broadcast_in_dim(c1, g4, {0, 1, 2})),
                      b.binary("multiply", x, b.broadcast_in_dim(c2, g4, {0, 1})));
  dx = b.binary("add", dx, b.broadcast_in_dim(c3, g4, {0, 1}));
  // grad_weight[c] = sum_n (ds - db * mean) * rstd; grad_bias[c] = sum_n db.
  Value dgamma = b.binary("multiply", b.binary("subtract", ds, b.binary("multiply", db, b.broadcast_in_dim(mean, g3, {0, 1}))),
                          b.broadcast_in_dim(rstd, g3, {0, 1}));
  dgamma = b.reshape(sum_over(b, dgamma, {0}), {d.c});
  Value dbeta = b.reshape(sum_over(b, db, {0}), {d.c});
  // All three: the executor drops the ones output_mask did not ask for.
  return {b.reshape(dx, input.shape()), dgamma, dbeta};
}

}  // namespace

TORCH_PJRT_LOWERING("native_group_norm", native_group_norm);
TORCH_PJRT_LOWERING("native_group_norm_backward", native_group_norm_backward);

}  // namespace torch_pjrt::lowering::ops
