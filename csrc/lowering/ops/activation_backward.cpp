// Backward ops of the activations in activation.cpp and unary.cpp (relu, gelu,
// silu, sigmoid, tanh). Each is a function of the incoming gradient and the
// saved input (or output), computed in float32 for half types and rounded once,
// as PyTorch's CPU kernels do.
#include <cmath>
#include <functional>
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

using GradFn = std::function<Value(Builder&, const Value& grad, const Value& x)>;

// fn(grad_output, `saved`) in the output's math dtype.
std::vector<Value> grad_unary(LoweringContext& ctx, const std::string& saved, const GradFn& fn) {
  DType out = ctx.out().dtype, dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  Value g = operand_as(ctx, "grad_output", dt, shape);
  Value x = operand_as(ctx, saved, dt, shape);
  return {ctx.b.convert(fn(ctx.b, g, x), out)};
}

// threshold_backward(grad_output, self, threshold): grad where self > threshold, else 0
// (relu's backward with threshold 0). NaN inputs pass the gradient, as on CPU.
std::vector<Value> threshold_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  const Shape& shape = ctx.out().shape;
  Value g = operand_as(ctx, "grad_output", out, shape);
  Value x = operand_as(ctx, "self", out, shape);
  Value th = operand_as(ctx, "threshold", out, shape);
  return {b.select(b.compare(Cmp::LE, x, th), b.zeros(g.type), g)};
}

// gelu_backward(grad_output, self, approximate): CPU's formulas for the erf form
// (cdf + x * pdf) and the tanh form.
std::vector<Value> gelu_backward(LoweringContext& ctx) {
  std::string approx = ctx.str("approximate", "none");
  return grad_unary(ctx, "self", [&](Builder& b, const Value& g, const Value& x) {
    auto k = [&](double v) { return splat_like(b, v, x); };
    auto mul = [&](const Value& a, const Value& c) { return b.binary("multiply", a, c); };
    auto add = [&](const Value& a, const Value& c) { return b.binary("add", a, c); };
    if (approx == "tanh") {
      const double kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715;
      Value x_sq = mul(x, x);
      Value inner = mul(k(kBeta), add(x, mul(k(kKappa), mul(x_sq, x))));
      Value t = b.unary("tanh", inner);
      Value left = mul(k(0.5), x);
      Value right = add(k(1), t);
      Value left_derivative = mul(k(0.5), right);
      Value right_derivative = b.binary("subtract", k(1), mul(t, t));
      Value inner_derivative = mul(k(kBeta), add(k(1), mul(k(3 * kKappa), x_sq)));
      return mul(g, add(left_derivative, mul(mul(left, right_derivative), inner_derivative)));
    }
    const double kAlpha = M_2_SQRTPI * M_SQRT1_2 * 0.5;
    Value cdf = mul(k(0.5), add(k(1), erf(b, mul(x, k(M_SQRT1_2)))));
    Value pdf = mul(k(kAlpha), b.unary("exponential", mul(mul(x, x), k(-0.5))));
    return mul(g, add(cdf, mul(x, pdf)));
  });
}

// silu_backward(grad_output, self) = grad * s * (1 + x * (1 - s)), s = sigmoid(x).
// (Eager decomposes it through its CompositeImplicitAutograd kernel; graphs may keep it.)
std::vector<Value> silu_backward(LoweringContext& ctx) {
  return grad_unary(ctx, "self", [](Builder& b, const Value& g, const Value& x) {
    Value s = b.unary("logistic", x);
    Value one = splat_like(b, 1, x);
    Value d = b.binary("multiply", s, b.binary("add", one, b.binary("multiply", x, b.binary("subtract", one, s))));
    return b.binary("multiply", g, d);
  });
}

// mish_backward(grad_output, self) = grad * (t + x * s * (1 - t^2)),
// t = tanh(softplus(x)), s = sigmoid(x), as CPU's kernel (float32 for half
// types). (Eager reaches it through lowering_routes.cpp; PyTorch has no Meta
// kernel for it, device/meta_kernels.cpp adds one.)
std::vector<Value> mish_backward(LoweringContext& ctx) {
  return grad_unary(ctx, "self", [](Builder& b, const Value& g, const Value& x) {
    Value one = splat_like(b, 1, x);
    Value s = b.unary("logistic", x);
    Value t = b.unary("tanh", b.unary("log_plus_one", b.unary("exponential", x)));
    Value d = b.binary("add", t, b.binary("multiply", b.binary("multiply", x, s),
                                          b.binary("subtract", one, b.binary("multiply", t, t))));
    return b.binary("multiply", g, d);
  });
}

// sigmoid_backward(grad_output, output) = grad * (1 - y) * y.
std::vector<Value> sigmoid_backward(LoweringContext& ctx) {
  return grad_unary(ctx, "output", [](Builder& b, const Value& g, const Value& y) {
    return b.binary("multiply", b.binary("multiply", g, b.binary("subtract", splat_like(b, 1, y), y)), y);
  });
}

// tanh_backward(grad_output, output) = grad * (1 - y^2).
std::vector<Value> tanh_backward(LoweringContext& ctx) {
  return grad_unary(ctx, "output", [](Builder& b, const Value& g, const Value& y) {
    return b.binary("multiply", g, b.binary("subtract", splat_like(b, 1, y), b.binary("multiply", y, y)));
  });
}

}  // namespace

TORCH_PJRT_LOWERING("threshold_backward", threshold_backward);
TORCH_PJRT_LOWERING("gelu_backward", gelu_backward);
TORCH_PJRT_LOWERING("silu_backward", silu_backward);
TORCH_PJRT_LOWERING("mish_backward", mish_backward);
TORCH_PJRT_LOWERING("sigmoid_backward", sigmoid_backward);
TORCH_PJRT_LOWERING("tanh_backward", tanh_backward);

}  // namespace torch_pjrt::lowering::ops
