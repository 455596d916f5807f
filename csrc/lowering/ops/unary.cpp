// Elementwise unary math. Float functions of integer inputs return PyTorch's
// default float (ctx.out().dtype); float16/bfloat16 are computed in float32 and
// rounded once, as PyTorch's CPU kernels do.
#include <cmath>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {


void simple(const char* aten, const char* hlo) {
  std::string name = hlo;
  register_lowering(aten, [name](LoweringContext& c) {
    return float_unary(c, [&](Builder& b, const Value& x) { return b.unary(name, x); });
  }, false, __FILE__);
}

Value reciprocal(Builder& b, const Value& x) {
  return b.binary("divide", splat_like(b, 1, x), x);
}

// abs/neg/sign/ceil/floor/round/trunc keep the input dtype (ints included).
std::vector<Value> abs(LoweringContext& ctx) {
  Value x = ctx.tensor("self");
  if (is_unsigned(x.dtype()) || x.dtype() == DType::Bool) return {x};
  if (is_complex(x.dtype())) return {ctx.b.op("stablehlo.abs", {x}, TensorType{real_dtype(x.dtype()), x.shape()})};
  return {ctx.b.unary("abs", x)};
}

Value real_part(Builder& b, const Value& x) {
  return b.op("stablehlo.real", {x}, TensorType{real_dtype(x.dtype()), x.shape()});
}
Value imag_part(Builder& b, const Value& x) {
  return b.op("stablehlo.imag", {x}, TensorType{real_dtype(x.dtype()), x.shape()});
}

// angle: atan2(imag, real) for complex; for real inputs pi below zero, else 0 (NaN kept).
std::vector<Value> angle(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  Value x = ctx.tensor("self");
  if (is_complex(x.dtype())) return {b.binary("atan2", imag_part(b, x), real_part(b, x))};
  x = b.convert(x, math_dtype(out));
  Value r = b.select(b.compare(Cmp::LT, x, splat_like(b, 0, x)), splat_like(b, M_PI, x), splat_like(b, 0, x));
  r = b.select(b.compare(Cmp::NE, x, x), x, r);
  return {b.convert(r, out)};
}

// conj_physical: (re, -im); real dtypes unchanged.
std::vector<Value> conj_physical(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (!is_complex(x.dtype())) return {x};
  return {b.op("stablehlo.complex", {real_part(b, x), b.unary("negate", imag_part(b, x))}, x.type)};
}

// polar(abs, angle): complex(abs cos(angle), abs sin(angle)).
std::vector<Value> polar(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType r = real_dtype(out.dtype);
  Value a = b.broadcast_to(b.convert(ctx.tensor("abs"), r), out.shape);
  Value t = b.broadcast_to(b.convert(ctx.tensor("angle"), r), out.shape);
  return {b.op("stablehlo.complex", {b.binary("multiply", a, b.unary("cosine", t)),
                                     b.binary("multiply", a, b.unary("sine", t))}, out)};
}

// complex(real, imag).
std::vector<Value> make_complex(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value re = b.broadcast_to(ctx.tensor("real"), out.shape), im = b.broadcast_to(ctx.tensor("imag"), out.shape);
  return {b.op("stablehlo.complex", {re, im}, out)};
}

std::vector<Value> neg(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (is_unsigned(x.dtype())) return {b.binary("subtract", splat_like(b, 0, x), x)};
  return {b.unary("negate", x)};
}

// PyTorch's sign is (0 < x) - (x < 0): 0 for NaN, where stablehlo.sign gives NaN.
std::vector<Value> sign(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (x.dtype() == DType::Bool) return {x};
  if (is_complex(x.dtype())) {
    // sgn: x / |x|, 0 at 0.
    Value a = b.op("stablehlo.abs", {x}, TensorType{real_dtype(x.dtype()), x.shape()});
    Value q = b.binary("divide", x, b.convert(a, x.dtype()));
    return {b.select(b.compare(Cmp::EQ, a, splat_like(b, 0, a)), splat_like(b, 0, x), q)};
  }
  Value zero = splat_like(b, 0, x), one = splat_like(b, 1, x);
  Value pos = b.select(b.compare(Cmp::GT, x, zero), one, zero);
  if (is_unsigned(x.dtype())) return {pos};
  Value negv = b.select(b.compare(Cmp::LT, x, zero), one, zero);
  return {b.binary("subtract", pos, negv)};
}

std::vector<Value> rounding(LoweringContext& ctx, const char* hlo) {
  Value x = ctx.tensor("self");
  if (!is_float(x.dtype())) return {x};
  return {ctx.b.unary(hlo, x)};
}

std::vector<Value> trunc(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (!is_float(x.dtype())) return {x};
  return {b.select(b.compare(Cmp::LT, x, splat_like(b, 0, x)), b.unary("ceil", x), b.unary("floor", x))};
}

// round(x, decimals): scaled as PyTorch does (multiply for decimals > 0, divide otherwise).
std::vector<Value> round(LoweringContext& ctx) {
  Builder& b = ctx.b;
  int64_t decimals = ctx.to_int("decimals", 0);
  Value x = ctx.tensor("self");
  if (!is_float(x.dtype())) return {x};
  if (decimals == 0) return {b.unary("round_nearest_even", x)};
  DType out = x.dtype();
  Value xm = b.convert(x, math_dtype(out));
  Value p = splat_like(b, std::pow(10.0, double(std::abs(decimals))), xm);
  Value r = decimals > 0
      ? b.binary("divide", b.unary("round_nearest_even", b.binary("multiply", xm, p)), p)
      : b.binary("multiply", b.unary("round_nearest_even", b.binary("divide", xm, p)), p);
  return {b.convert(r, out)};
}

// isnan/isinf of ints are all false. (isfinite is a composite of abs, eq and ne;
// isinf decomposes in eager but stays whole in torch.compile graphs.)
std::vector<Value> isnan(LoweringContext& ctx) {
  Value x = ctx.tensor("self");
  if (!is_float(x.dtype())) return {ctx.b.zeros({DType::Bool, x.shape()})};
  return {ctx.b.compare(Cmp::NE, x, x)};
}

// isinf / isposinf / isneginf: x compared with +-inf (|x| for isinf).
LowerFn infinity_test(int sign) {
  return [sign](LoweringContext& ctx) -> std::vector<Value> {
    Builder& b = ctx.b;
    Value x = ctx.tensor("self");
    if (!is_float(x.dtype())) return {b.zeros({DType::Bool, x.shape()})};
    Value v = sign == 0 ? b.unary("abs", x) : x;
    return {b.compare(Cmp::EQ, v, splat_like(b, sign < 0 ? -INFINITY : INFINITY, x))};
  };
}

// logit(x, eps) = log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given.
std::vector<Value> logit(LoweringContext& ctx) {
  bool clamp = ctx.has("eps");
  double eps = ctx.to_double("eps", 0.0);
  return float_unary(ctx, [&](Builder& b, const Value& x0) {
    Value x = x0;
    if (clamp)
      x = b.binary("minimum", b.binary("maximum", x, splat_like(b, eps, x)), splat_like(b, 1.0 - eps, x));
    return b.unary("log", b.binary("divide", x, b.binary("subtract", splat_like(b, 1.0, x), x)));
  });
}

// logit_backward: grad / (x (1 - x)); with eps, 0 outside [eps, 1 - eps];
// without, NaN outside [0, 1] (as CPU).
std::vector<Value> logit_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = math_dtype(out.dtype);
  Value g = b.convert(ctx.tensor("grad_output"), dt), x = b.convert(ctx.tensor("self"), dt);
  bool clamp = ctx.has("eps");
  double eps = ctx.to_double("eps", 0.0);
  double lo = clamp ? eps : 0.0, hi = clamp ? 1.0 - eps : 1.0;
  Value r = b.binary("divide", g, b.binary("multiply", x, b.binary("subtract", splat_like(b, 1.0, x), x)));
  Value outside = b.binary("or", b.compare(Cmp::LT, x, splat_like(b, lo, x)), b.compare(Cmp::GT, x, splat_like(b, hi, x)));
  r = b.select(outside, splat_like(b, clamp ? 0.0 : NAN, x), r);
  return {b.convert(r, out.dtype)};
}

// pow.Tensor_Tensor, pow.Tensor_Scalar and pow.Scalar: either side may be the
// scalar. Computed in the promoted output dtype.
std::vector<Value> pow(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  Value base = operand_as(ctx, "self", dt, shape);
  const Arg& e = ctx.arg("exponent");
  // Exact squares, as PyTorch special-cases them.
  if (e.kind != Arg::Tensor && e.scalar.to_double() == 2.0) return {b.convert(b.binary("multiply", base, base), out)};
  return {b.convert(b.binary("power", base, operand_as(ctx, "exponent", dt, shape)), out)};
}

}  // namespace

static const bool registered = [] {
  simple("exp", "exponential");
  simple("expm1", "exponential_minus_one");
  simple("log", "log");
  simple("log1p", "log_plus_one");
  simple("sqrt", "sqrt");
  simple("rsqrt", "rsqrt");
  simple("tanh", "tanh");
  simple("sin", "sine");
  simple("cos", "cosine");
  simple("tan", "tan");
  return true;
}();

TORCH_PJRT_LOWERING("erf", [](LoweringContext& c) { return float_unary(c, erf); });
TORCH_PJRT_LOWERING("reciprocal", [](LoweringContext& c) { return float_unary(c, reciprocal); });
TORCH_PJRT_LOWERING("pow", pow);
TORCH_PJRT_LOWERING("abs", abs);
TORCH_PJRT_LOWERING("angle", angle);
TORCH_PJRT_LOWERING("conj_physical", conj_physical);
TORCH_PJRT_LOWERING("_conj_physical", conj_physical);
TORCH_PJRT_LOWERING("complex", make_complex);
TORCH_PJRT_LOWERING("polar", polar);
TORCH_PJRT_LOWERING("neg", neg);
TORCH_PJRT_LOWERING("sign", sign);
TORCH_PJRT_LOWERING("sgn", sign);  // sign for real dtypes (l1_loss backward uses it)
TORCH_PJRT_LOWERING("ceil", [](LoweringContext& c) { return rounding(c, "ceil"); });
TORCH_PJRT_LOWERING("floor", [](LoweringContext& c) { return rounding(c, "floor"); });
TORCH_PJRT_LOWERING("round", round);
TORCH_PJRT_LOWERING("trunc", trunc);
TORCH_PJRT_LOWERING("isnan", isnan);
TORCH_PJRT_LOWERING("logit", logit);
TORCH_PJRT_LOWERING("logit_backward", logit_backward);
TORCH_PJRT_LOWERING("isinf", infinity_test(0));
TORCH_PJRT_LOWERING("isposinf", infinity_test(1));
TORCH_PJRT_LOWERING("isneginf", infinity_test(-1));

}  // namespace torch_pjrt::lowering::ops
