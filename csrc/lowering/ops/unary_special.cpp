// More elementwise float functions: inverse trigonometric and hyperbolic
// functions, erfc/erfinv, lgamma/digamma/polygamma (CHLO ops, expanded by
// XLA), log2/log10/exp2, sinc, frac and signbit. Integer inputs give
// PyTorch's default float (ctx.out().dtype); half types are computed in
// float32 and rounded once, as PyTorch's CPU kernels do.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lowering/ops/common.h"
#include "lowering/ops/hurwitz.h"

namespace torch_pjrt::lowering::ops {

HurwitzShift hurwitz_shift(Builder& b, const Value& s, const Value& q_in, const Value& active) {
  const int64_t kMaxSteps = 1 << 16;
  std::vector<int64_t> all;
  for (int64_t d = 0; d < q_in.rank(); ++d) all.push_back(d);
  // state: step, q, sum, s, active (s and active carried: the loop's regions
  // see only their arguments)
  auto below_one = [](Builder& b, const Value& y, const Value& on) {  // (-inf is left to the caller)
    return b.binary("and", on, b.binary("and", b.compare(Cmp::LT, y, splat_like(b, 1, y)),
                                        b.compare(Cmp::GT, y, splat_like(b, -INFINITY, y))));
  };
  auto cond = [&](Builder& b, const std::vector<Value>& st) {
    Value any = b.reduce(below_one(b, st[1], st[4]), b.constant_int(0, DType::Bool), all, "stablehlo.or");
    Value more = b.compare(Cmp::LT, st[0], b.constant_int(kMaxSteps, DType::I64));
    return std::vector<Value>{b.binary("and", any, more)};
  };
  auto body = [&](Builder& b, const std::vector<Value>& st) {
    const Value &y = st[1], &acc = st[2];
    Value need = below_one(b, y, st[4]);
    Value term = b.binary("power", y, b.unary("negate", st[3]));
    return std::vector<Value>{b.binary("add", st[0], b.constant_int(1, DType::I64)),
                              b.select(need, b.binary("add", y, splat_like(b, 1, y)), y),
                              b.binary("add", acc, b.select(need, term, b.zeros(y.type))), st[3], st[4]};
  };
  std::vector<Value> r =
      b.while_loop({b.constant_int(0, DType::I64), q_in, b.zeros(q_in.type), s, active}, cond, body);
  return {r[1], r[2], below_one(b, r[1], active)};
}

namespace {

// (complex: the branch cut's side from z's signed zeros, complex_math.cpp;
// `odd`: f(-z) = -f(z))
void chlo_unary(const char* aten, const char* chlo, bool odd = false) {
  std::string name = chlo;
  register_lowering(aten, [name, odd](LoweringContext& c) {
    return float_unary(c, [&](Builder& b, const Value& x) {
      return is_complex(x.dtype()) ? complex_inverse_trig(b, x, name, odd) : b.op(name, {x}, x.type);
    });
  }, false, __FILE__);
}

// The signed integer type of a float's bits, for bit tests.
DType bits_dtype(DType t) {
  switch (t) {
    case DType::F64: return DType::I64;
    case DType::F32: return DType::I32;
    default: return DType::I16;
  }
}

// x = m * 2^e with m in [sqrt(1/2), sqrt(2)) (e in x's type), and whether x
// is a positive normal number, for which the split is valid.
struct Split {
  Value m, e, normal;
};

Split split_exponent(Builder& b, const Value& x) {
  bool f64 = x.dtype() == DType::F64;
  int mant = f64 ? 52 : 23, bias = f64 ? 1023 : 127;
  DType it = f64 ? DType::I64 : DType::I32;
  TensorType itype{it, x.shape()};
  auto k = [&](int64_t v) { return b.splat(Scalar::from_int(v), itype); };
  Value bits = b.bitcast_convert(x, itype);
  int64_t all_ones = (int64_t(1) << (f64 ? 11 : 8)) - 1;
  Value field = b.binary("and", b.op("stablehlo.shift_right_logical", {bits, k(mant)}, itype), k(all_ones));
  int64_t mant_mask = (int64_t(1) << mant) - 1;
  Value m = b.bitcast_convert(b.binary("or", b.binary("and", bits, k(mant_mask)), k(int64_t(bias) << mant)),
                              x.type);  // in [1, 2)
  Value e = b.convert(b.binary("subtract", field, k(bias)), x.dtype());
  Value big = b.compare(Cmp::GT, m, splat_like(b, M_SQRT2, m));
  m = b.select(big, b.binary("multiply", m, splat_like(b, 0.5, m)), m);
  e = b.select(big, b.binary("add", e, splat_like(b, 1, e)), e);
  Value normal = b.binary("and", b.compare(Cmp::GT, x, splat_like(b, 0, x)),
                          b.binary("and", b.compare(Cmp::NE, field, k(0)), b.compare(Cmp::NE, field, k(all_ones))));
  return {m, e, normal};
}

// log2(x) = e + log(m) / ln 2: exact at powers of two (m = 1), where
// log(x) / ln 2 can miss by an ulp (log2(8).floor() must be 3), and no
// cancellation near 1. Zero, negatives, inf, NaN and subnormals take
// log(x) / ln 2, which is right for them.
Value log2(Builder& b, const Value& x) {
  if (is_complex(x.dtype())) return complex_log_base(b, x, M_LN2);
  Split s = split_exponent(b, x);
  Value inv_ln2 = splat_like(b, 1.0 / M_LN2, x);
  Value r = b.binary("add", s.e, b.binary("multiply", b.unary("log", s.m), inv_ln2));
  return b.select(s.normal, r, b.binary("multiply", b.unary("log", x), inv_ln2));
}

// log10(x) = e log10(2) + log(m) / ln 10, log10(2) split into a part whose
// product with e is exact (its low 12 mantissa bits zero) and the rest: the
// terms' rounding is far below the result's ulp, so powers of ten come out
// exact (log10(1000).floor() must be 3; log(x) / ln 10 missed them by up to
// 3 ulps, and 269 of float64's 277 powers of ten after floor).
Value log10(Builder& b, const Value& x) {
  if (is_complex(x.dtype())) return complex_log_base(b, x, M_LN10);
  // hi: log10(2) to 2^-40 (float64) or 2^-12 (float32), so e * hi is exact
  // for every exponent e; lo: the rest (in long double, then the type's).
  int bits = x.dtype() == DType::F64 ? 40 : 12;
  double hi = std::ldexp(std::round(std::ldexp(std::log10(2.0), bits)), -bits);
  double lo = static_cast<double>(std::log10(2.0L) - static_cast<long double>(hi));
  Split s = split_exponent(b, x);
  Value rest = b.binary("add", b.binary("multiply", s.e, splat_like(b, lo, x)),
                        b.binary("multiply", b.unary("log", s.m), splat_like(b, 1.0 / M_LN10, x)));
  Value r = b.binary("add", b.binary("multiply", s.e, splat_like(b, hi, x)), rest);
  return b.select(s.normal, r, b.binary("divide", b.unary("log", x), splat_like(b, M_LN10, x)));
}

// 2^x as pow(2, x): exact at integers, where exp(x ln 2) is not.
Value exp2(Builder& b, const Value& x) {
  if (is_complex(x.dtype())) return complex_exp2(b, x);
  return b.binary("power", splat_like(b, 2, x), x);
}

// sinc(x) = sin(pi x) / (pi x), 1 at 0, the product rounded as on CPU.
Value sinc(Builder& b, const Value& x) {
  Value px = b.binary("multiply", x, splat_like(b, M_PI, x));
  Value sin = is_complex(x.dtype()) ? complex_sin_or_cos(b, px, false) : b.unary("sine", px);
  Value r = b.binary("divide", sin, px);
  return b.select(b.compare(Cmp::EQ, x, splat_like(b, 0, x)), splat_like(b, 1, x), r);
}

// digamma: CPU gives -inf at +0, +inf at -0 and NaN at negative integers.
Value digamma(Builder& b, const Value& x) {
  Value r = b.op("chlo.digamma", {x}, x.type);
  Value zero = splat_like(b, 0, x);
  Value at_zero = b.compare(Cmp::EQ, x, zero);
  Value signed_inf = b.select(signbit(b, x), splat_like(b, INFINITY, x), splat_like(b, -INFINITY, x));
  Value neg_int = b.binary("and", b.compare(Cmp::LT, x, zero), b.compare(Cmp::EQ, x, b.unary("floor", x)));
  r = b.select(neg_int, splat_like(b, NAN, x), r);
  return b.select(at_zero, signed_inf, r);
}

// zeta(k) - 1 for 2 <= k < 64 to double precision: the sum below N (smallest
// terms first) and Euler-Maclaurin's tail from N, whose next term is below
// 1e-22 with N = 1000 (N = 32 left 7e-13 in zeta(2): float64's series
// needs more than float32's did). Computed once.
double zeta_minus_one(int k) {
  static const std::vector<double> table = [] {
    std::vector<double> t(64, 0.0);
    const double N = 1000;
    for (int j = 2; j < 64; ++j) {
      double s = 0;
      for (int n = static_cast<int>(N) - 1; n >= 2; --n) s += std::pow(n, -j);
      double nk = std::pow(N, -j);
      t[j] = s + N * nk / (j - 1) + nk / 2 + j * nk / N / 12 - double(j) * (j + 1) * (j + 2) * nk / (N * N * N) / 720;
    }
    return t;
  }();
  return table.at(k);
}

// lgamma(1 + e) (or lgamma(2 + e) = lgamma(1 + e) + log1p(e)) for |e| <= 1/2
// by its Taylor series: -gamma e + sum_k (-1)^k zeta(k) / k e^k (zeta(k) - 1
// and 1 - gamma for 2 + e), exact at 0 and accurate relative to the result
// near lgamma's zeros at 1 and 2, where CHLO's Lanczos form cancels
// (lgamma(1.0) was 4.8e-7 in float32, lgamma(0.9999) 1.6% off).
Value lgamma_near_one_or_two(Builder& b, const Value& e, bool two, int terms = 28) {
  // (the rest is below 1e-9 of the result for |e| <= 1/2 after 28 terms,
  // below 1e-18 after 60)
  const double euler_gamma = 0.57721566490153286061;
  Value r = splat_like(b, 0, e);
  for (int k = terms; k >= 2; --k) {
    double c = (zeta_minus_one(k) + (two ? 0 : 1)) / k * (k % 2 ? -1 : 1);
    r = b.binary("multiply", b.binary("add", r, splat_like(b, c, e)), e);
  }
  r = b.binary("add", r, splat_like(b, two ? 1 - euler_gamma : -euler_gamma, e));
  Value zero = splat_like(b, 0, e);  // (+0 at the zeros, as CPU; -gamma * 0 is -0)
  return b.select(b.compare(Cmp::EQ, e, zero), zero, b.binary("multiply", r, e));
}

// lgamma: +inf at 0 and the non-positive integers, and at -inf. Float32
// (and the half types, computed in it) on [0, 8) from the series: below 1/2
// as lgamma(1 + x) - log x, above 5/2 by the recurrence down to [3/2, 5/2)
// (lgamma(x) = lgamma(x - n) + log((x - 1)...(x - n))): within 2 ulp there,
// where CHLO's form was 11-51 ulp off.
Value lgamma(Builder& b, const Value& x) {
  Value r = b.op("chlo.lgamma", {x}, x.type);
  if (x.dtype() == DType::F32 || x.dtype() == DType::F64) {
    // (float64 with 60 terms: CHLO's form was 0 at 1 + 2^-51, 223 ulps off
    // on [1.25, 1.75), 71 on [2.5, 8))
    int terms = x.dtype() == DType::F64 ? 60 : 28;
    auto k = [&](double v) { return splat_like(b, v, x); };
    auto in = [&](double lo, double hi) {
      return b.binary("and", b.compare(Cmp::GE, x, k(lo)), b.compare(Cmp::LT, x, k(hi)));
    };
    Value small = b.binary("subtract", lgamma_near_one_or_two(b, x, false, terms), b.unary("log", x));
    Value near_one = lgamma_near_one_or_two(b, b.binary("subtract", x, k(1)), false, terms);
    // x - n in [3/2, 5/2) for x in [3/2, 8): n = floor(x - 3/2) steps down
    Value n = b.unary("floor", b.binary("subtract", x, k(1.5)));
    Value prod = k(1);
    for (int i = 1; i <= 6; ++i)
      prod = b.select(b.compare(Cmp::GE, n, k(i)), b.binary("multiply", prod, b.binary("subtract", x, k(i))), prod);
    Value up = b.binary("add", lgamma_near_one_or_two(b, b.binary("subtract", b.binary("subtract", x, n), k(2)), true, terms),
                        b.unary("log", prod));
    r = b.select(in(0, 0.5), small, b.select(in(0.5, 1.5), near_one, b.select(in(1.5, 8), up, r)));
  }
  Value pole = b.binary("and", b.compare(Cmp::LE, x, splat_like(b, 0, x)), b.compare(Cmp::EQ, x, b.unary("floor", x)));
  return b.select(pole, splat_like(b, INFINITY, x), r);
}

// polygamma(n, x): n = 0 is digamma; otherwise CHLO's, with CPU's values at
// the poles (0 and the negative integers): +inf for odd n, -inf for even n
// (the sign of (-1)^(n+1) n! / x^(n+1) from the right). At +inf: 0 for n = 1,
// NaN above; at -inf: NaN for n = 1, the pole's value above. (CPU's trigamma
// gives large finite values at the negative integers, from sin(pi x) not
// being 0 there; here they are +inf.)
//
// CHLO's polygamma sums the Hurwitz zeta series from x with a fixed number of
// terms, which is right only for positive x (garbage below about -7). So x is
// first moved up to [1, 2) by the recurrence
//   psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1),
// in a loop that runs as many steps as the most negative element needs (CPU's
// zeta sums the same terms from x upward). Past 2^16 steps (x < -65535) the
// result is NaN rather than a loop that never ends (x + 1 == x in float32).
// In float64, as CPU accumulates (the terms of a negative x cancel).
Value polygamma_of_positive_shift(Builder& b, int64_t n, const Value& x_in) {
  Value x = b.convert(x_in, DType::F64);
  HurwitzShift h = hurwitz_shift(b, splat_like(b, double(n + 1), x), x, b.compare(Cmp::EQ, x, x));
  double factorial = std::exp(std::lgamma(double(n) + 1));
  Value shifted = b.op("chlo.polygamma", {splat_like(b, double(n), h.q), h.q}, h.q.type);
  Value out = b.binary("add", shifted, b.binary("multiply", splat_like(b, n % 2 ? factorial : -factorial, h.q), h.sum));
  return b.convert(b.select(h.unfinished, splat_like(b, NAN, h.q), out), x_in.dtype());  // NaN: past the limit
}

std::vector<Value> polygamma(LoweringContext& ctx) {
  int64_t n = ctx.to_int("n", 0);
  return float_unary(ctx, [&](Builder& b, const Value& x) {
    if (n == 0) return digamma(b, x);
    Value r = polygamma_of_positive_shift(b, n, x);
    Value pole_value = splat_like(b, n % 2 ? INFINITY : -INFINITY, x);
    Value pole = b.binary("and", b.compare(Cmp::LE, x, splat_like(b, 0, x)), b.compare(Cmp::EQ, x, b.unary("floor", x)));
    r = b.select(pole, pole_value, r);
    Value nan = splat_like(b, NAN, x);
    r = b.select(b.compare(Cmp::EQ, x, splat_like(b, INFINITY, x)), n == 1 ? splat_like(b, 0, x) : nan, r);
    return b.select(b.compare(Cmp::EQ, x, splat_like(b, -INFINITY, x)), n == 1 ? nan : pole_value, r);
  });
}

// frac = x - trunc(x), float dtypes only (CPU has no integer kernel).
std::vector<Value> frac(LoweringContext& ctx) {
  DType t = ctx.tensor("self").dtype();
  if (!is_float(t)) ctx.kernel_not_implemented("frac_cpu", t);
  return float_unary(ctx, [](Builder& b, const Value& v) {
    Value t = b.select(b.compare(Cmp::LT, v, splat_like(b, 0, v)), b.unary("ceil", v), b.unary("floor", v));
    return b.binary("subtract", v, t);
  });
}

// frexp: x = mantissa * 2^exponent with |mantissa| in [0.5, 1), as std::frexp;
// zero, inf and NaN are their own mantissa with exponent 0. Bit arithmetic
// only (XLA's CPU backend flushes subnormal products): a subnormal's mantissa
// bits are shifted up to the implicit bit's place. Half types go through
// float32 (exact).
std::vector<Value> frexp(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  if (!is_float(self.dtype()))
    ctx.fail("torch.frexp() only supports floating-point dtypes");
  bool f64 = self.dtype() == DType::F64;
  DType wt = f64 ? DType::F64 : DType::F32, it = f64 ? DType::I64 : DType::I32;
  int64_t mant = f64 ? 52 : 23, bias = f64 ? 1023 : 127, width = f64 ? 64 : 32;
  Value x = b.convert(self, wt);
  TensorType itype{it, x.shape()};
  auto k = [&](int64_t v) { return b.splat(Scalar::from_int(v), itype); };
  auto band = [&](const Value& u, const Value& v) { return b.binary("and", u, v); };
  Value bits = b.bitcast_convert(x, itype);
  int64_t field_mask = (int64_t(1) << (f64 ? 11 : 8)) - 1, mant_mask = (int64_t(1) << mant) - 1;
  Value field = band(b.op("stablehlo.shift_right_logical", {bits, k(mant)}, itype), k(field_mask));
  Value frac = band(bits, k(mant_mask));
  Value sign = band(bits, k(f64 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int32_t>::min()));
  // Normal: exponent field - (bias - 1), the fraction kept. Subnormal: its
  // leading one at bit msb makes the exponent msb + 1 - (bias - 1 + mant).
  Value msb = b.binary("subtract", k(width - 1), b.unary("count_leading_zeros", frac));
  Value sub = b.compare(Cmp::EQ, field, k(0));
  Value e = b.select(sub, b.binary("subtract", msb, k(bias - 2 + mant)), b.binary("subtract", field, k(bias - 1)));
  Value shifted = band(b.op("stablehlo.shift_left", {frac, b.binary("subtract", k(mant), msb)}, itype), k(mant_mask));
  frac = b.select(sub, shifted, frac);
  Value m = b.bitcast_convert(b.binary("or", sign, b.binary("or", frac, k((bias - 1) << mant))), x.type);
  // Zero, inf and NaN: no leading one (a zero field and fraction) or the top field.
  Value special = b.binary("or", b.binary("and", sub, b.compare(Cmp::EQ, band(bits, k(mant_mask)), k(0))),
                           b.compare(Cmp::EQ, field, k(field_mask)));
  m = b.select(special, x, m);
  e = b.select(special, k(0), e);
  return {b.convert(m, ctx.out(0).dtype), b.convert(e, ctx.out(1).dtype)};
}

// entr(x) = -x ln x: 0 at 0, -inf below 0, NaN for NaN.
Value entr(Builder& b, const Value& x) {
  Value r = b.binary("multiply", b.unary("negate", x), b.unary("log", x));
  Value zero = splat_like(b, 0, x);
  r = b.select(b.compare(Cmp::EQ, x, zero), zero, r);
  return b.select(b.compare(Cmp::LT, x, zero), splat_like(b, -INFINITY, x), r);
}

}  // namespace

// The sign bit of a float (true for -0.0 and negative NaNs); x < 0 for integers.
Value signbit(Builder& b, const Value& x) {
  if (x.dtype() == DType::Bool || is_unsigned(x.dtype())) return b.zeros({DType::Bool, x.shape()});
  if (!is_float(x.dtype())) return b.compare(Cmp::LT, x, splat_like(b, 0, x));
  TensorType it{bits_dtype(x.dtype()), x.shape()};
  return b.compare(Cmp::LT, b.bitcast_convert(x, it), b.zeros(it));
}

// sinh and cosh. CHLO's are up to 5-12 ulp off for |x| > 5 (an exp of
// |x| - log 2, whose rounded argument carries |x|'s ulp). For |x| > 1:
// (e^|x| +- e^-|x|) / 2 with exact arguments, and near overflow, where
// e^-|x| no longer counts, (e^(|x|/2) / 2) e^(|x|/2). About 1.5 ulp.
// (CPU's float32 cosh overflows from 88.72; this one, as the true value,
// from 89.42.)
Value real_sinh_or_cosh(Builder& b, const Value& x, bool cosh) {
  Value r = b.op(cosh ? "chlo.cosh" : "chlo.sinh", {x}, x.type);
  bool f64 = x.dtype() == DType::F64;
  Value ax = b.unary("abs", x), half = splat_like(b, 0.5, x);
  Value both = b.binary(cosh ? "add" : "subtract", b.unary("exponential", ax),
                        b.unary("exponential", b.unary("negate", ax)));
  Value root = b.unary("exponential", b.binary("multiply", ax, half));
  Value big = b.select(b.compare(Cmp::LT, ax, splat_like(b, f64 ? 709.0 : 88.0, x)),
                       b.binary("multiply", half, both), b.binary("multiply", b.binary("multiply", half, root), root));
  if (!cosh) big = b.select(b.compare(Cmp::LT, x, splat_like(b, 0, x)), b.unary("negate", big), big);
  return b.select(b.compare(Cmp::GT, ax, splat_like(b, 1.0, x)), big, r);
}

namespace {

const bool registered = [] {
  chlo_unary("asin", "chlo.asin", true);
  chlo_unary("acos", "chlo.acos");
  chlo_unary("atan", "chlo.atan", true);
  chlo_unary("asinh", "chlo.asinh", true);
  chlo_unary("acosh", "chlo.acosh");
  return true;
}();

// erfinv: CHLO's, then in float32 one Newton step on 0.9 <= |x| < 1 with the
// residual erfc(|y|) - (1 - |x|). CHLO's float32 form starts from
// w = -log1p(-x*x), whose rounding of x*x cost up to 63 ulps on
// 0.9985 <= |x| < 0.99997 (CPU: 0.5; Normal.icdf's tails). There 1 - |x| is
// exact and erfc accurate in relative terms, so the step lands within an ulp.
Value erfinv(Builder& b, const Value& x) {
  Value y = b.op("chlo.erf_inv", {x}, x.type);
  // (float64: the same step from 0.5 on, where CHLO's was up to 21 ulps off,
  // and 5e5 at 1 - 1e-8 > |x| > 1 - 1e-12.)
  double from = x.dtype() == DType::F64 ? 0.5 : 0.9;
  Value ax = b.unary("abs", x), ay = b.unary("abs", y), one = splat_like(b, 1, x);
  Value resid = b.binary("subtract", erfc(b, ay), b.binary("subtract", one, ax));
  Value slope = b.binary("multiply", splat_like(b, std::sqrt(M_PI) / 2, x),
                         b.unary("exponential", b.binary("multiply", ay, ay)));
  Value refined = b.binary("add", ay, b.binary("multiply", resid, slope));
  refined = b.select(b.compare(Cmp::LT, x, splat_like(b, 0, x)), b.unary("negate", refined), refined);
  Value tail = b.binary("and", b.compare(Cmp::GE, ax, splat_like(b, from, x)), b.compare(Cmp::LT, ax, one));
  return b.select(tail, refined, y);
}

}  // namespace

TORCH_PJRT_LOWERING("erfinv", [](LoweringContext& c) { return float_unary(c, erfinv); });
TORCH_PJRT_LOWERING("erfc", [](LoweringContext& c) { return float_unary(c, erfc); });
// atanh: in float64 0.5 * (log1p(x) - log1p(-x)) through Builder::unary's
// log1p (chlo.atanh's own log1p was 126 ulps off at |x| near 0.414).
TORCH_PJRT_LOWERING("atanh", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    if (is_complex(x.dtype())) return complex_inverse_trig(b, x, "chlo.atanh", true);
    if (x.dtype() != DType::F64) return b.op("chlo.atanh", {x}, x.type);
    Value d = b.binary("subtract", b.unary("log_plus_one", x), b.unary("log_plus_one", b.unary("negate", x)));
    return b.binary("multiply", d, splat_like(b, 0.5, x));
  });
});

TORCH_PJRT_LOWERING("sinh", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_sinh_or_cosh(b, x, false) : real_sinh_or_cosh(b, x, false);
  });
});
TORCH_PJRT_LOWERING("cosh", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) {
    return is_complex(x.dtype()) ? complex_sinh_or_cosh(b, x, true) : real_sinh_or_cosh(b, x, true);
  });
});
TORCH_PJRT_LOWERING("log2", [](LoweringContext& c) { return float_unary(c, log2); });
TORCH_PJRT_LOWERING("log10", [](LoweringContext& c) { return float_unary(c, log10); });
TORCH_PJRT_LOWERING("exp2", [](LoweringContext& c) { return float_unary(c, exp2); });
TORCH_PJRT_LOWERING("sinc", [](LoweringContext& c) { return float_unary(c, sinc); });
TORCH_PJRT_LOWERING("lgamma", [](LoweringContext& c) { return float_unary(c, lgamma); });
TORCH_PJRT_LOWERING("digamma", [](LoweringContext& c) { return float_unary(c, digamma); });
TORCH_PJRT_LOWERING("polygamma", polygamma);
TORCH_PJRT_LOWERING("frac", frac);
TORCH_PJRT_LOWERING("frexp", frexp);
TORCH_PJRT_LOWERING("special_entr", [](LoweringContext& c) { return float_unary(c, entr); });
TORCH_PJRT_LOWERING("signbit", [](LoweringContext& c) {
  return std::vector<Value>{signbit(c.b, c.tensor("self"))};
});

}  // namespace torch_pjrt::lowering::ops
