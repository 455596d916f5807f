// Elementwise unary math. Float functions of integer inputs return PyTorch's
// default float (ctx.out().dtype); float16/bfloat16 are computed in float32 and
// rounded once, as PyTorch's CPU kernels do.
#include <cmath>
#include <limits>
#include <optional>

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
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (is_unsigned(x.dtype()) || x.dtype() == DType::Bool) return {x};
  if (is_complex(x.dtype())) return {complex_abs(b, x)};
  return {b.unary("abs", x)};
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
  return {make_complex(b, real_part(b, x), b.unary("negate", imag_part(b, x)))};
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
std::vector<Value> complex_op(LoweringContext& ctx) {
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
    // sgn: each part / |x| (rounded as CPU's), 0 at 0.
    Value a = complex_abs(b, x);
    Value q = make_complex(b, b.binary("divide", real_part(b, x), a), b.binary("divide", imag_part(b, x), a));
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
  if (!is_float(x.dtype()) && !is_complex(x.dtype())) return {ctx.b.zeros({DType::Bool, x.shape()})};
  return {ctx.b.compare(Cmp::NE, x, x)};  // complex: either part NaN
}

// isinf / isposinf / isneginf: x compared with +-inf (|x| for isinf).
LowerFn infinity_test(int sign) {
  return [sign](LoweringContext& ctx) -> std::vector<Value> {
    Builder& b = ctx.b;
    Value x = ctx.tensor("self");
    if (sign == 0 && is_complex(x.dtype())) {  // either part infinite, as CPU
      TensorType rt{real_dtype(x.dtype()), x.shape()};
      Value inf = b.splat(Scalar::from_float(INFINITY), rt);
      Value re = b.unary("abs", real_part(b, x)), im = b.unary("abs", imag_part(b, x));
      return {b.binary("or", b.compare(Cmp::EQ, re, inf), b.compare(Cmp::EQ, im, inf))};
    }
    if (!is_float(x.dtype())) return {b.zeros({DType::Bool, x.shape()})};
    Value v = sign == 0 ? b.unary("abs", x) : x;
    return {b.compare(Cmp::EQ, v, splat_like(b, sign < 0 ? -INFINITY : INFINITY, x))};
  };
}

// nan_to_num(self, nan, posinf, neginf): NaN -> nan (0), +inf -> posinf (the
// dtype's largest finite value), -inf -> neginf (its lowest), the values
// converted to the dtype as CPU does; complex: each part; integers unchanged.
Value replace_non_finite(LoweringContext& ctx, const Value& x) {
  Builder& b = ctx.b;
  auto value = [&](const char* name, double dflt) {
    return ctx.has(name) ? operand_as(ctx, name, x.dtype(), x.shape()) : splat_like(b, dflt, x);
  };
  double big = largest_finite(x.dtype());
  Value r = b.select(b.compare(Cmp::NE, x, x), value("nan", 0.0), x);
  r = b.select(b.compare(Cmp::EQ, x, splat_like(b, INFINITY, x)), value("posinf", big), r);
  return b.select(b.compare(Cmp::EQ, x, splat_like(b, -INFINITY, x)), value("neginf", -big), r);
}

std::vector<Value> nan_to_num(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (is_complex(x.dtype()))
    return {make_complex(b, replace_non_finite(ctx, real_part(b, x)), replace_non_finite(ctx, imag_part(b, x)))};
  if (!is_float(x.dtype())) return {x};
  return {replace_non_finite(ctx, x)};
}

// logit(x, eps) = log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given.
// Half types round as CPU's kernel does in the type: eps and 1 - eps (so
// 1 - 1e-6 is 1 in float16, and logit(2.0, 1e-6) is inf), then 1 - x and
// the quotient (c10::Half's and BFloat16's operators round each result).
std::vector<Value> logit(LoweringContext& ctx) {
  bool clamp = ctx.has("eps");
  double eps = ctx.to_double("eps", 0.0);
  DType dt = ctx.out().dtype;
  return float_unary(ctx, [&](Builder& b, const Value& x0) {
    auto in_type = [&](const Value& v) { return rounded_to(b, v, dt); };
    Value x = x0, one = splat_like(b, 1.0, x0);
    // CPU's x < lo ? lo : (x > hi ? hi : x): NaN stays NaN, and with eps
    // above 0.5 (lo > hi) x below lo becomes lo. (Not min/max: XLA turns
    // those into a clamp, which XLA:CPU's LLVM IR emitters give `lo` for NaN.)
    if (clamp) {
      Value lo = in_type(splat_like(b, eps, x0)), hi = in_type(b.binary("subtract", one, lo));
      x = b.select(b.compare(Cmp::LT, x0, lo), lo, b.select(b.compare(Cmp::GT, x0, hi), hi, x0));
    }
    return b.unary("log", in_type(b.binary("divide", x, in_type(b.binary("subtract", one, x)))));
  });
}

// logit_backward: grad / (x (1 - x)); with eps, 0 outside [eps, 1 - eps];
// without, NaN outside [0, 1] (as CPU). Half types round as logit's forward:
// the bounds and each result in the type (in float16, 1 - 1e-6 is 1, so x = 1
// is inside and its gradient is inf, as on CPU).
std::vector<Value> logit_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = math_dtype(out.dtype);
  auto in_type = [&](const Value& v) { return rounded_to(b, v, out.dtype); };
  Value g = b.convert(ctx.tensor("grad_output"), dt), x = b.convert(ctx.tensor("self"), dt);
  bool clamp = ctx.has("eps");
  double eps = ctx.to_double("eps", 0.0);
  Value one = splat_like(b, 1.0, x);
  Value lo = clamp ? in_type(splat_like(b, eps, x)) : splat_like(b, 0.0, x);
  Value hi = clamp ? in_type(b.binary("subtract", one, lo)) : one;
  Value r = in_type(b.binary("divide", g, in_type(b.binary("multiply", x, in_type(b.binary("subtract", one, x))))));
  Value outside = b.binary("or", b.compare(Cmp::LT, x, lo), b.compare(Cmp::GT, x, hi));
  r = b.select(outside, splat_like(b, clamp ? 0.0 : NAN, x), r);
  return {b.convert(r, out.dtype)};
}

// Integer pow as CPU's powi: square-and-multiply over every bit of the
// exponent, the products wrapping. (XLA's integer stablehlo.power only looks
// at the exponent's low 6 bits: 0 ** 64 gave 1.) `known`: the exponent's
// value when it is a build-time scalar (already wrapped to the dtype), so only
// its set bits cost ops; else `e` is a tensor of base's dtype and shape.
// Negative exponents, as powi: 1 for base 1, +-1 for base -1, else 0.
Value integer_pow(Builder& b, const Value& base, const Value& e, std::optional<int64_t> known) {
  DType dt = base.dtype();
  int bits = 8 * int(itemsize(dt));
  Value one = splat_like(b, 1, base), zero = splat_like(b, 0, base);
  Value r = one, sq = base, rest = e;
  uint64_t k = known ? uint64_t(*known) : 0;
  if (known && bits < 64) k &= (uint64_t(1) << bits) - 1;
  bool known_negative = known && *known < 0 && !is_unsigned(dt);
  for (int i = 0; i < bits && !known_negative; ++i) {
    if (known) {
      if (k >> i & 1) r = b.binary("multiply", r, sq);
      if (!(k >> (i + 1))) break;
    } else {
      Value bit_set = b.compare(Cmp::NE, b.binary("and", rest, one), zero);
      r = b.select(bit_set, b.binary("multiply", r, sq), r);
      if (i + 1 == bits) break;
      rest = b.op("stablehlo.shift_right_logical", {rest, one}, rest.type);
    }
    sq = b.binary("multiply", sq, sq);
  }
  if (is_unsigned(dt) || (known && !known_negative)) return r;
  Value odd = b.compare(Cmp::NE, b.binary("and", e, one), zero);
  Value minus_one = splat_like(b, -1, base);
  Value neg = b.select(b.compare(Cmp::EQ, base, one), one,
                       b.select(b.compare(Cmp::EQ, base, minus_one), b.select(odd, minus_one, one), zero));
  if (known) return neg;
  return b.select(b.compare(Cmp::LT, e, zero), neg, r);
}

// x^y; complex as glibc's cpow (complex_math.cpp).
Value power(Builder& b, const Value& x, const Value& y) {
  return is_complex(x.dtype()) ? complex_pow(b, x, y) : b.binary("power", x, y);
}

// pow.Tensor_Tensor, pow.Tensor_Scalar and pow.Scalar: either side may be the
// scalar. Computed in the promoted output dtype.
std::vector<Value> pow(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  // (A scalar base or exponent of a half result is rounded to it first, as
  // CPU's kernels receive it: pow(10000.0, x) in bfloat16 is 9984^x.)
  Value base = operand_rounded(ctx, "self", out, shape);
  const Arg& e = ctx.arg("exponent");
  // CPU special-cases these scalar exponents of a float tensor (sqrt(-inf)
  // is NaN where pow(-inf, 0.5) is inf; x * x is exact). A runtime exponent
  // (one program for every value) chooses at run time; reading its value here
  // would tie the program to it.
  bool scalar_exponent = e.kind != Arg::Tensor;
  auto special = [&](const Value& x, double v) -> std::optional<Value> {
    auto one = [&] { return splat_like(b, 1, x); };
    if (v == 0) return one();
    if (v == 1) return x;
    if (v == 0.5) return b.unary("sqrt", x);
    if (v == -0.5) return b.unary("rsqrt", x);
    if (v == -1) return b.binary("divide", one(), x);
    if (v == 2) return b.binary("multiply", x, x);
    // (CPU's bfloat16 vectors round x * x before the next step; its float16
    // ones do not.)
    Value sq = out == DType::BF16 ? rounded_to(b, b.binary("multiply", x, x), out) : b.binary("multiply", x, x);
    if (v == 3) return b.binary("multiply", sq, x);
    if (v == -2) return b.binary("divide", one(), sq);
    return std::nullopt;
  };
  bool specials = is_float(dt) || is_complex(dt);  // (CPU's complex kernel has them too)
  if (scalar_exponent && specials && !e.dynamic && e.kind != Arg::Tensor)
    if (auto r = special(base, ctx.scalar("exponent").to_double())) return {b.convert(*r, out)};
  // CPU rounds the exponent of a half result to the half type first (2049
  // is 2048 in float16, 0.3 is 0.30078 in bfloat16), then computes in float32.
  Value exponent = operand_rounded(ctx, "exponent", out, shape);
  // An int exponent past float32's integers (2**31 - 1) rounds to an even
  // one; CPU takes it as a double for float32 and float64 results, so a
  // negative base (-0.0 too) keeps the sign of the int's parity:
  // -2 ** (2**31 - 1) is -inf. (For half results CPU rounds it to the half
  // type, as here.)
  auto int_parity_sign = [&](Value r) {
    if (e.kind != Arg::Int || (out != DType::F32 && out != DType::F64)) return r;
    Value odd;
    if (e.dynamic) {
      Value ei = b.broadcast_to(b.convert(*e.dynamic, DType::I64), shape);
      odd = b.compare(Cmp::NE, b.binary("and", ei, splat_like(b, 1, ei)), splat_like(b, 0, ei));
    } else {
      // (Only an odd one the compute type rounds away: past 2**24 in
      // float32; past 2**53 a double rounds it to even too.)
      int64_t v = ctx.scalar("exponent").i;
      uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
      bool rounded_odd = mag % 2 == 1 && mag > (uint64_t{1} << (dt == DType::F64 ? 53 : 24)) && mag <= (uint64_t{1} << 53);
      if (!rounded_odd) return r;
      odd = b.splat(Scalar::from_bool(true), TensorType{DType::Bool, shape});
    }
    Value zero = splat_like(b, 0, base);
    Value negative = b.binary("or", b.compare(Cmp::LT, base, zero),
                              b.compare(Cmp::LT, b.binary("divide", splat_like(b, 1, base), base), zero));
    return b.select(b.binary("and", negative, odd), b.unary("negate", b.unary("abs", r)), r);
  };
  if (scalar_exponent && specials && e.dynamic) {
    Value r = power(b, base, exponent);
    for (double v : {0.0, 1.0, 0.5, -0.5, -1.0, 2.0, 3.0, -2.0})
      r = b.select(b.compare(Cmp::EQ, exponent, splat_like(b, v, exponent)), *special(base, v), r);
    return {b.convert(int_parity_sign(r), out)};
  }
  // bool ** bool (the only pow with a bool result): x ** True = x, x ** False = True, as CPU.
  if (dt == DType::Bool) return {b.binary("or", base, b.unary("not", exponent))};
  if (is_integral(dt, /*include_bool=*/false)) {
    std::optional<int64_t> known;
    if (e.kind == Arg::Int || e.kind == Arg::Bool) {
      // (pow.Tensor_Scalar's Meta function makes this check; compiled graphs
      // whose exponent is a graph constant do not run it)
      if (e.kind == Arg::Int && ctx.scalar("exponent").i < 0)
        ctx.fail("Integers to negative integer powers are not allowed.");
      // The scalar as CPU converts it to the dtype (two's complement wrap).
      int bits = 8 * int(itemsize(dt));
      uint64_t u = uint64_t(ctx.scalar("exponent").i);
      if (bits < 64) {
        u &= (uint64_t(1) << bits) - 1;
        if (!is_unsigned(dt) && (u >> (bits - 1))) u |= ~((uint64_t(1) << bits) - 1);
      }
      known = int64_t(u);
    }
    return {integer_pow(b, base, exponent, known)};
  }
  return {b.convert(int_parity_sign(power(b, base, exponent)), out)};
}

}  // namespace

static const bool registered = [] {
  simple("expm1", "exponential_minus_one");
  simple("log", "log");
  simple("log1p", "log_plus_one");
  simple("rsqrt", "rsqrt");
  simple("tanh", "tanh");
  simple("tan", "tan");
  return true;
}();

// (complex: XLA's forms lose the small part, complex_math.cpp)
TORCH_PJRT_LOWERING("exp", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_exp(b, x) : b.unary("exponential", x);
  });
});
TORCH_PJRT_LOWERING("sqrt", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_sqrt(b, x) : b.unary("sqrt", x);
  });
});
TORCH_PJRT_LOWERING("sin", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_sin_or_cos(b, x, false) : b.unary("sine", x);
  });
});
TORCH_PJRT_LOWERING("cos", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_sin_or_cos(b, x, true) : b.unary("cosine", x);
  });
});
TORCH_PJRT_LOWERING("erf", [](LoweringContext& c) { return float_unary(c, erf); });
TORCH_PJRT_LOWERING("reciprocal", [](LoweringContext& c) { return float_unary(c, reciprocal); });
TORCH_PJRT_LOWERING("pow", pow);
TORCH_PJRT_LOWERING("abs", abs);
TORCH_PJRT_LOWERING("angle", angle);
TORCH_PJRT_LOWERING("conj_physical", conj_physical);
TORCH_PJRT_LOWERING("_conj_physical", conj_physical);
TORCH_PJRT_LOWERING("complex", complex_op);
TORCH_PJRT_LOWERING("polar", polar);
TORCH_PJRT_LOWERING("neg", neg);
TORCH_PJRT_LOWERING("sign", sign);
TORCH_PJRT_LOWERING("sgn", sign);  // sign for real dtypes (l1_loss backward uses it)
TORCH_PJRT_LOWERING("ceil", [](LoweringContext& c) { return rounding(c, "ceil"); });
TORCH_PJRT_LOWERING("floor", [](LoweringContext& c) { return rounding(c, "floor"); });
TORCH_PJRT_LOWERING("round", round);
TORCH_PJRT_LOWERING("trunc", trunc);
TORCH_PJRT_LOWERING("isnan", isnan);
TORCH_PJRT_LOWERING("nan_to_num", nan_to_num);
TORCH_PJRT_LOWERING("logit", logit);
TORCH_PJRT_LOWERING("logit_backward", logit_backward);
TORCH_PJRT_LOWERING("isinf", infinity_test(0));
TORCH_PJRT_LOWERING("isposinf", infinity_test(1));
TORCH_PJRT_LOWERING("isneginf", infinity_test(-1));

}  // namespace torch_pjrt::lowering::ops
