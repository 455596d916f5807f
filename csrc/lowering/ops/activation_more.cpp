// More activations with their backward ops: leaky_relu, elu (selu and celu are
// composites of it), hardtanh (relu6), softplus, hardswish, hardsigmoid, mish,
// log_sigmoid, glu and threshold. Float math in float32 for half types, rounded
// once, with the formulas of PyTorch's CPU kernels (aten/src/ATen/native/cpu/
// Activation.cpp). Scalar hyperparameters are operands, so changing them does not
// change the program's structure.
#include <functional>
#include <string>
#include <utility>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct Ops {
  Builder& b;
  Value k(double v, const Value& like) const { return splat_like(b, v, like); }
  Value add(const Value& x, const Value& y) const { return b.binary("add", x, y); }
  Value sub(const Value& x, const Value& y) const { return b.binary("subtract", x, y); }
  Value mul(const Value& x, const Value& y) const { return b.binary("multiply", x, y); }
  Value div(const Value& x, const Value& y) const { return b.binary("divide", x, y); }
  Value sel(const Value& p, const Value& x, const Value& y) const { return b.select(p, x, y); }
  Value cmp(Cmp c, const Value& x, const Value& y) const { return b.compare(c, x, y); }
  Value exp(const Value& x) const { return b.unary("exponential", x); }
};

// The result dtype, the dtype it is computed in, and its shape; in() reads an
// argument (tensor or scalar) converted and broadcast to them.
struct Inputs {
  DType out, dt;
  Shape shape;
};
Inputs inputs(const LoweringContext& ctx) {
  DType out = ctx.out().dtype;
  return {out, math_dtype(out), ctx.out().shape};
}
Value in(LoweringContext& ctx, const Inputs& io, const std::string& name) {
  return operand_as(ctx, name, io.dt, io.shape);
}

// ---- leaky_relu ---------------------------------------------------------------

std::vector<Value> leaky_relu(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value x = in(ctx, io, "self"), slope = in(ctx, io, "negative_slope");
  return {ctx.b.convert(o.sel(o.cmp(Cmp::GT, x, o.k(0, x)), x, o.mul(x, slope)), io.out)};
}

std::vector<Value> leaky_relu_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self"), slope = in(ctx, io, "negative_slope");
  return {ctx.b.convert(o.sel(o.cmp(Cmp::GT, x, o.k(0, x)), g, o.mul(g, slope)), io.out)};
}

// ---- elu: x > 0 ? scale * x : alpha * scale * expm1(input_scale * x) ---------------

std::vector<Value> elu(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value x = in(ctx, io, "self");
  Value negcoef = o.mul(in(ctx, io, "alpha"), in(ctx, io, "scale"));
  Value poscoef = in(ctx, io, "scale"), negiptcoef = in(ctx, io, "input_scale");
  Value neg = o.mul(ctx.b.unary("exponential_minus_one", o.mul(x, negiptcoef)), negcoef);
  return {ctx.b.convert(o.sel(o.cmp(Cmp::LE, x, o.k(0, x)), neg, o.mul(x, poscoef)), io.out)};
}

// elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
// from the result y (in-place elu) the negative branch is g * input_scale * (y + alpha*scale).
std::vector<Value> elu_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), v = in(ctx, io, "self_or_result");
  Value negcoef = o.mul(in(ctx, io, "alpha"), in(ctx, io, "scale"));
  Value poscoef = in(ctx, io, "scale"), negiptcoef = in(ctx, io, "input_scale");
  Value neg = ctx.to_bool("is_result", false)
      ? o.mul(o.mul(g, negiptcoef), o.add(v, negcoef))
      : o.mul(o.mul(o.mul(g, negiptcoef), negcoef), o.exp(o.mul(v, negiptcoef)));
  return {ctx.b.convert(o.sel(o.cmp(Cmp::LE, v, o.k(0, v)), neg, o.mul(g, poscoef)), io.out)};
}

// ---- hardtanh: clamp to [min_val, max_val], NaN passing through ------------------

std::vector<Value> hardtanh(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value x = in(ctx, io, "self"), lo = in(ctx, io, "min_val"), hi = in(ctx, io, "max_val");
  Value r = o.sel(o.cmp(Cmp::LT, x, lo), lo, o.sel(o.cmp(Cmp::GT, x, hi), hi, x));
  return {ctx.b.convert(r, io.out)};
}

std::vector<Value> hardtanh_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self");
  Value lo = in(ctx, io, "min_val"), hi = in(ctx, io, "max_val");
  Value outside = ctx.b.binary("or", o.cmp(Cmp::LE, x, lo), o.cmp(Cmp::GE, x, hi));
  return {ctx.b.convert(o.sel(outside, o.k(0, g), g), io.out)};
}

// ---- softplus: beta*x > threshold ? x : log1p(exp(beta*x)) / beta -----------------

std::vector<Value> softplus(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value x = in(ctx, io, "self"), beta = in(ctx, io, "beta"), th = in(ctx, io, "threshold");
  Value bx = o.mul(x, beta);
  Value soft = o.div(ctx.b.unary("log_plus_one", o.exp(bx)), beta);
  return {ctx.b.convert(o.sel(o.cmp(Cmp::GT, bx, th), x, soft), io.out)};
}

std::vector<Value> softplus_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self");
  Value beta = in(ctx, io, "beta"), th = in(ctx, io, "threshold");
  Value bx = o.mul(x, beta);
  Value z = o.exp(bx);
  Value soft = o.div(o.mul(g, z), o.add(z, o.k(1, z)));
  return {ctx.b.convert(o.sel(o.cmp(Cmp::GT, bx, th), g, soft), io.out)};
}

// ---- hardswish = x * clamp(x + 3, 0, 6) / 6, hardsigmoid = clamp(x + 3, 0, 6) / 6 ----

Value relu6_shifted(const Ops& o, const Value& x) {
  Value t = o.add(x, o.k(3, x));
  t = o.sel(o.cmp(Cmp::LT, t, o.k(0, x)), o.k(0, x), t);
  return o.sel(o.cmp(Cmp::GT, t, o.k(6, x)), o.k(6, x), t);
}

std::vector<Value> hardswish(LoweringContext& ctx) {
  Ops o{ctx.b};
  return float_unary(ctx, [&](Builder&, const Value& x) { return o.div(o.mul(x, relu6_shifted(o, x)), o.k(6, x)); });
}

std::vector<Value> hardsigmoid(LoweringContext& ctx) {
  Ops o{ctx.b};
  return float_unary(ctx, [&](Builder&, const Value& x) { return o.div(relu6_shifted(o, x), o.k(6, x)); });
}

// x <= -3: 0; x < 3: g * (x / 3 + 0.5); else g (the CPU kernel's boundaries).
std::vector<Value> hardswish_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self");
  Value mid = o.mul(g, o.add(o.div(x, o.k(3, x)), o.k(0.5, x)));
  Value r = o.sel(o.cmp(Cmp::LE, x, o.k(-3, x)), o.k(0, x), o.sel(o.cmp(Cmp::LT, x, o.k(3, x)), mid, g));
  return {ctx.b.convert(r, io.out)};
}

// -3 < x < 3: g / 6; else 0.
std::vector<Value> hardsigmoid_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self");
  Value inside = ctx.b.binary("and", o.cmp(Cmp::GT, x, o.k(-3, x)), o.cmp(Cmp::LT, x, o.k(3, x)));
  return {ctx.b.convert(o.sel(inside, o.mul(g, o.k(1.0 / 6.0, g)), o.k(0, g)), io.out)};
}

// ---- mish = x * tanh(softplus(x)); its backward is a composite in eager ------------

std::vector<Value> mish(LoweringContext& ctx) {
  Ops o{ctx.b};
  return float_unary(ctx, [&](Builder& b, const Value& x) {
    return o.mul(x, b.unary("tanh", b.unary("log_plus_one", o.exp(x))));
  });
}

// ---- log_sigmoid_forward -> (min(0, x) - log1p(z), z) with z = exp(-|x|) -----------

std::vector<Value> log_sigmoid_forward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Ops o{b};
  DType out = ctx.out(0).dtype, dt = math_dtype(out);
  Value x = b.convert(ctx.tensor("self"), dt);
  Value z = o.exp(b.unary("negate", b.unary("abs", x)));
  Value m = o.sel(o.cmp(Cmp::LT, x, o.k(0, x)), x, o.k(0, x));
  Value r = o.sub(m, b.unary("log_plus_one", z));
  // CPU fills the buffer with z; other backends give an empty one. Follow the Meta shape.
  Value buffer = ctx.out(1).numel() == x.type.numel() ? b.convert(z, ctx.out(1).dtype) : b.zeros(ctx.out(1));
  return {b.convert(r, out), buffer};
}

// (x < 0 ? 1 - z / (1 + z) : z / (1 + z)) * grad, recomputing z as the CPU kernel does.
std::vector<Value> log_sigmoid_backward(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value g = in(ctx, io, "grad_output"), x = in(ctx, io, "self");
  Value z = o.exp(ctx.b.unary("negate", ctx.b.unary("abs", x)));
  Value q = o.div(z, o.add(o.k(1, z), z));
  Value d = o.sel(o.cmp(Cmp::LT, x, o.k(0, x)), o.sub(o.k(1, x), q), q);
  return {ctx.b.convert(o.mul(d, g), io.out)};
}

// ---- glu(self, dim) = a * sigmoid(b) with a, b the halves of `dim` ----------------

std::pair<Value, Value> halves(Builder& b, const Value& x, int64_t dim) {
  Shape start(x.rank(), 0), mid = x.shape(), limit = x.shape();
  mid[dim] = x.shape()[dim] / 2;
  Shape start2 = start;
  start2[dim] = mid[dim];
  return {b.slice(x, start, mid), b.slice(x, start2, limit)};
}

std::vector<Value> glu(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, dt = math_dtype(out);
  Value x = b.convert(ctx.tensor("self"), dt);
  auto [a, g] = halves(b, x, wrap_dim(ctx.to_int("dim", -1), x.rank()));
  return {b.convert(b.binary("multiply", a, b.unary("logistic", g)), out)};
}

// grad_a = grad * s, grad_b = grad * a * s * (1 - s), s = sigmoid(b), concatenated.
std::vector<Value> glu_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Ops o{b};
  DType out = ctx.out().dtype, dt = math_dtype(out);
  Value x = b.convert(ctx.tensor("self"), dt);
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), x.rank());
  Value grad = b.convert(ctx.tensor("grad_output"), dt);
  auto [a, h] = halves(b, x, dim);
  Value s = b.unary("logistic", h);
  Value ga = o.mul(grad, s);
  Value gb = o.mul(o.mul(ga, o.sub(o.k(1, s), s)), a);
  return {b.convert(b.concatenate({ga, gb}, dim), out)};
}

// ---- threshold(self, threshold, value) = self <= threshold ? value : self ---------

std::vector<Value> threshold(LoweringContext& ctx) {
  Ops o{ctx.b};
  Inputs io = inputs(ctx);
  Value x = in(ctx, io, "self");
  Value r = o.sel(o.cmp(Cmp::LE, x, in(ctx, io, "threshold")), in(ctx, io, "value"), x);
  return {ctx.b.convert(r, io.out)};
}

}  // namespace

TORCH_PJRT_LOWERING("leaky_relu", leaky_relu);
TORCH_PJRT_LOWERING("leaky_relu_backward", leaky_relu_backward);
TORCH_PJRT_LOWERING("elu", elu);
TORCH_PJRT_LOWERING("elu_backward", elu_backward);
TORCH_PJRT_LOWERING("hardtanh", hardtanh);
TORCH_PJRT_LOWERING("hardtanh_backward", hardtanh_backward);
TORCH_PJRT_LOWERING("softplus", softplus);
TORCH_PJRT_LOWERING("softplus_backward", softplus_backward);
TORCH_PJRT_LOWERING("hardswish", hardswish);
TORCH_PJRT_LOWERING("hardswish_backward", hardswish_backward);
TORCH_PJRT_LOWERING("hardsigmoid", hardsigmoid);
TORCH_PJRT_LOWERING("hardsigmoid_backward", hardsigmoid_backward);
TORCH_PJRT_LOWERING("mish", mish);
TORCH_PJRT_LOWERING("log_sigmoid_forward", log_sigmoid_forward);
TORCH_PJRT_LOWERING("log_sigmoid_backward", log_sigmoid_backward);
TORCH_PJRT_LOWERING("glu", glu);
TORCH_PJRT_LOWERING("glu_backward", glu_backward);
TORCH_PJRT_LOWERING("threshold", threshold);

}  // namespace torch_pjrt::lowering::ops
