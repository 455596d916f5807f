// Complex elementwise functions computed as PyTorch's CPU computes them
// (std:: functions on std::complex, i.e. glibc's csin/csinh/..., and ATen's
// own formulas for exp2/log2/log10/logaddexp), where XLA's complex
// expansions differ: its sin/cos/sinh/cosh lose the small part (sin(1e-8j)
// gave 0), and its divisions by a real constant make NaN parts at infinities.
// Inverse trigonometric functions keep XLA's expansion (within 2 ulp of a
// float64 reference) but take the branch cut's side from a signed zero, as
// C99 asks and CPU does (asin(1.5 - 0j) is pi/2 - 0.96j).
#include <cmath>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

Value real_part(Builder& b, const Value& z) {
  return b.op("stablehlo.real", {z}, TensorType{real_dtype(z.dtype()), z.shape()});
}
Value imag_part(Builder& b, const Value& z) {
  return b.op("stablehlo.imag", {z}, TensorType{real_dtype(z.dtype()), z.shape()});
}
Value make_complex(Builder& b, const Value& re, const Value& im) {
  return b.op("stablehlo.complex", {re, im}, TensorType{complex_dtype(re.dtype()), re.shape()});
}

namespace {

// x * y, but an exact zero where either factor is one, with the product's
// sign, even beside an infinity or NaN: glibc keeps sinh(1e4 + 0j)'s
// imaginary part 0 (inf * 0 is NaN) and cosh(0 + inf j)'s too.
Value times_zero_kept(Builder& b, const Value& x, const Value& y) {
  Value zero = splat_like(b, 0, x), neg_zero = splat_like(b, -0.0, x);
  auto signed_zero = [&](const Value& v) { return b.select(signbit(b, v), neg_zero, zero); };
  Value either = b.binary("or", b.compare(Cmp::EQ, x, zero), b.compare(Cmp::EQ, y, zero));
  return b.select(either, b.binary("multiply", signed_zero(x), signed_zero(y)), b.binary("multiply", x, y));
}

// sinh(a + ib) = sinh a cos b + i cosh a sin b; cosh(a + ib) = cosh a cos b + i sinh a sin b.
Value sinh_cosh_parts(Builder& b, const Value& a, const Value& im, bool cosh) {
  Value sh = real_sinh_or_cosh(b, a, false), ch = real_sinh_or_cosh(b, a, true);
  Value c = b.unary("cosine", im), s = b.unary("sine", im);
  Value re = cosh ? b.binary("multiply", ch, c) : times_zero_kept(b, c, sh);
  Value i = times_zero_kept(b, cosh ? sh : ch, s);
  return make_complex(b, re, i);
}

// Each part times a real constant k (T * std::complex<T>).
Value complex_scaled(Builder& b, const Value& z, double k) {
  Value re = real_part(b, z), im = imag_part(b, z);
  return make_complex(b, b.binary("multiply", re, splat_like(b, k, re)), b.binary("multiply", im, splat_like(b, k, im)));
}

}  // namespace

Value complex_sinh_or_cosh(Builder& b, const Value& z, bool cosh) {
  return sinh_cosh_parts(b, real_part(b, z), imag_part(b, z), cosh);
}

// sin(a + ib) = sin a cosh b + i cos a sinh b; cos z = cosh(iz) = cosh(-b + ia), as glibc's ccos.
Value complex_sin_or_cos(Builder& b, const Value& z, bool cos) {
  Value a = real_part(b, z), im = imag_part(b, z);
  if (cos) return sinh_cosh_parts(b, b.unary("negate", im), a, true);
  Value re = times_zero_kept(b, real_sinh_or_cosh(b, im, true), b.unary("sine", a));
  Value i = times_zero_kept(b, b.unary("cosine", a), real_sinh_or_cosh(b, im, false));
  return make_complex(b, re, i);
}

// exp(a + ib) = e^a (cos b + i sin b) with C99's (glibc's cexp) values
// where a part is not finite or b is 0: exp(-inf + i inf) is 0, exp(inf +
// i NaN) inf + NaN i, exp(x + 0i) e^x + 0i even past overflow. (XLA's gave
// NaN + NaN i for the infinite ones.)
Value complex_exp(Builder& b, const Value& z) {
  Value a = real_part(b, z), im = imag_part(b, z);
  Value r = b.unary("exponential", a);
  Value c = b.unary("cosine", im), s = b.unary("sine", im);
  Value re = b.binary("multiply", r, c), i = times_zero_kept(b, r, s);
  Value inf = splat_like(b, INFINITY, a), zero = splat_like(b, 0, a);
  Value im_finite = b.compare(Cmp::EQ, b.binary("subtract", im, im), zero);  // (NaN for inf and NaN)
  Value neg_inf = b.compare(Cmp::EQ, a, b.unary("negate", inf)), pos_inf = b.compare(Cmp::EQ, a, inf);
  Value not_finite = b.unary("not", im_finite);
  re = b.select(b.binary("and", neg_inf, not_finite), zero, b.select(b.binary("and", pos_inf, not_finite), inf, re));
  i = b.select(b.binary("and", neg_inf, not_finite), zero,
               b.select(b.binary("and", pos_inf, not_finite), splat_like(b, NAN, a), i));
  return make_complex(b, re, i);
}

// ATen's exp2 of a complex: exp(ln2 * z), ln2 in the part type.
Value complex_exp2(Builder& b, const Value& z) {
  double ln2 = z.dtype() == DType::C64 ? double(float(M_LN2)) : M_LN2;
  return complex_exp(b, complex_scaled(b, z, ln2));
}

// x^y: XLA's power, but exp(y log x) as glibc's cpow where x is 0 (XLA's
// gave NaN for 0^y with Re y > 0, where CPU gives 0, and 1 for 0^0, where
// CPU gives NaN). (exp(y log x) everywhere was 50 ulps from the exact
// value in complex128 where glibc's is 11 and XLA's 7.)
Value complex_pow(Builder& b, const Value& x, const Value& y) {
  Value at_zero = complex_exp(b, b.binary("multiply", y, b.unary("log", x)));
  Value zero = b.zeros(x.type);
  return b.select(b.compare(Cmp::EQ, x, zero), at_zero, b.binary("power", x, y));
}

// sqrt with the branch cut's side from the imaginary part's sign:
// sqrt(conj z) = conj sqrt(z), so sqrt(-4 - 0j) is -2j (XLA's gave +2j): the
// inverse functions' conjugate symmetry, below.
Value complex_sqrt(Builder& b, const Value& z) { return complex_inverse_trig(b, z, "stablehlo.sqrt", false); }

// log(z) with each part divided by ln(base) rounded to the part type: CPU's
// log10 (std::log10, log(z) / T(ln 10)) and its vectorized log2.
Value complex_log_base(Builder& b, const Value& z, double ln_base) {
  Value l = b.unary("log", z), re = real_part(b, l), im = imag_part(b, l);
  double k = z.dtype() == DType::C64 ? double(float(ln_base)) : ln_base;
  return make_complex(b, b.binary("divide", re, splat_like(b, k, re)), b.binary("divide", im, splat_like(b, k, im)));
}

// ATen's logaddexp of complex x, y (LogAddExp.h): min/max by real part (a
// NaN in either part of y, then of x, wins); NaN if the min has a NaN part;
// the min where both real parts are the same infinity below 0, log(e^min +
// e^max) where above; else log1p(exp(min - max)) + max.
Value complex_logaddexp(Builder& b, const Value& x, const Value& y) {
  auto has_nan = [&](const Value& v) { return b.compare(Cmp::NE, v, v); };
  Value y_nan = has_nan(y), x_nan = has_nan(x);
  Value x_lower = b.compare(Cmp::LT, real_part(b, x), real_part(b, y));
  Value mn = b.select(y_nan, y, b.select(x_nan, x, b.select(x_lower, x, y)));
  Value mx = b.select(y_nan, y, b.select(x_nan, x, b.select(x_lower, y, x)));
  Value mn_re = real_part(b, mn), mx_re = real_part(b, mx);
  Value general = b.binary("add", b.unary("log_plus_one", b.unary("exponential", b.binary("subtract", mn, mx))), mx);
  Value both_inf = b.binary("and", b.compare(Cmp::EQ, mn_re, mx_re),
                            b.compare(Cmp::EQ, b.unary("abs", mn_re), splat_like(b, INFINITY, mn_re)));
  Value pos_inf = b.unary("log", b.binary("add", b.unary("exponential", mn), b.unary("exponential", mx)));
  Value inf_case = b.select(b.compare(Cmp::LT, mn_re, splat_like(b, 0, mn_re)), mn, pos_inf);
  Value nan = b.splat(Scalar::from_float(NAN), TensorType{real_dtype(x.dtype()), x.shape()});
  return b.select(has_nan(mn), make_complex(b, nan, nan), b.select(both_inf, inf_case, general));
}

// An inverse trigonometric function `f` of a complex z with the branch cut's
// side taken from the signs of z's parts (-0.0 included), using f(conj z) =
// conj f(z): f is evaluated at (re + i|im|) and conjugated where im's sign
// bit is set. The odd ones (`odd`: asin, asinh, atan, atanh; f(-z) = -f(z))
// are evaluated at (|re| + i|im|), their real part then taking re's sign.
// (XLA's expansions ignore the sign of a zero part.)
Value complex_inverse_trig(Builder& b, const Value& z, const std::string& chlo, bool odd) {
  Value re = real_part(b, z), im = imag_part(b, z);
  Value neg_im = signbit(b, im);
  Value w = b.op(chlo, {make_complex(b, odd ? b.unary("abs", re) : re, b.unary("abs", im))}, z.type);
  Value wr = real_part(b, w), wi = imag_part(b, w);
  if (odd) wr = b.select(signbit(b, re), b.unary("negate", wr), wr);
  return make_complex(b, wr, b.select(neg_im, b.unary("negate", wi), wi));
}

}  // namespace torch_pjrt::lowering::ops
