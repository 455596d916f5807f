// hypot(x, y) and |z| of a complex tensor as PyTorch's CPU kernels round
// them. CPU takes hypot to within half an ulp (SLEEF's hypot, std::hypot,
// std::abs); XLA's complex abs and the textbook max * sqrt(1 + (min/max)^2)
// are an ulp off for about a third of values. That mattered where a value on
// tpu meets one from CPU: the backward of an inf-norm that ran on the CPU
// compares |x| == norm, found no maximum, and divided by zero. Here: both
// parts scaled by a power of two (exact), the sum of squares in double-word
// arithmetic (Dekker's exact products from Veltkamp splits, Knuth's two-sum),
// its square root corrected once by the residual, and scaled back.
#include <cmath>
#include <stdexcept>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct Parts {
  DType bits;       // the same-width unsigned type
  int mantissa;     // mantissa bits
  int64_t max_exp;  // the biased exponent of infinity/NaN
  double splitter;  // 2^ceil(mantissa / 2) + 1 (Veltkamp)
};

Parts parts_of(DType t) {
  if (t == DType::F64) return {DType::U64, 52, 2047, 134217729.0};
  return {DType::U32, 23, 255, 4097.0};
}

// Elementwise float arithmetic, written as formulas.
struct Arith {
  Builder& b;
  Value add(const Value& p, const Value& q) const { return b.binary("add", p, q); }
  Value sub(const Value& p, const Value& q) const { return b.binary("subtract", p, q); }
  Value mul(const Value& p, const Value& q) const { return b.binary("multiply", p, q); }

  // x * x as hi + lo exactly (x's square neither overflows nor underflows).
  std::pair<Value, Value> exact_square(const Value& x, double splitter) const {
    Value hi = mul(x, x);
    Value t = mul(splat_like(b, splitter, x), x);
    Value xh = sub(t, sub(t, x)), xl = sub(x, xh);
    Value cross = mul(mul(xh, xl), splat_like(b, 2, x));
    return {hi, add(add(sub(mul(xh, xh), hi), cross), mul(xl, xl))};
  }
};

}  // namespace

Value hypot_as_cpu(Builder& b, const Value& x_in, const Value& y_in) {
  DType rt = x_in.dtype();
  if (rt != DType::F32 && rt != DType::F64) throw std::runtime_error("hypot_as_cpu: float32 or float64 only");
  const TensorType& real = x_in.type;
  Value re = b.unary("abs", x_in), im = b.unary("abs", y_in);
  Parts p = parts_of(rt);
  TensorType ut{p.bits, real.shape};
  auto bits_const = [&](int64_t v) { return b.splat(Scalar::from_int(v), ut); };
  Arith a{b};
  auto add = [&](const Value& x, const Value& y) { return a.add(x, y); };
  auto sub = [&](const Value& x, const Value& y) { return a.sub(x, y); };
  auto mul = [&](const Value& x, const Value& y) { return a.mul(x, y); };

  // The larger part's biased exponent E (clamped to the normal range) and
  // inv = 2^(bias + 1 - E): big * inv is in [2, 4), or below for subnormals.
  Value big = b.binary("maximum", re, im);
  Value e = b.op("stablehlo.shift_right_logical",
                 {b.bitcast_convert(big, ut), bits_const(p.mantissa)}, ut);
  e = b.binary("maximum", b.binary("minimum", e, bits_const(p.max_exp - 1)), bits_const(1));
  Value inv = b.bitcast_convert(
      b.op("stablehlo.shift_left", {sub(bits_const(p.max_exp), e), bits_const(p.mantissa)}, ut), real);
  Value x = mul(re, inv), y = mul(im, inv);

  // s = x^2 + y^2 as hi + lo.
  auto [x2, x2_lo] = a.exact_square(x, p.splitter);
  auto [y2, y2_lo] = a.exact_square(y, p.splitter);
  Value s = add(x2, y2);
  Value bv = sub(s, x2);
  Value s_lo = add(add(sub(x2, sub(s, bv)), sub(y2, bv)), add(x2_lo, y2_lo));
  Value hi = add(s, s_lo);
  Value lo = sub(s_lo, sub(hi, s));

  // r = sqrt(hi + lo), corrected by its residual: r + (hi + lo - r^2) / 2r.
  Value r = b.unary("sqrt", hi);
  auto [r2, r2_lo] = a.exact_square(r, p.splitter);
  Value residual = add(sub(sub(hi, r2), r2_lo), lo);
  Value zero = b.zeros(real);
  Value fixed = add(r, b.binary("divide", residual, mul(r, splat_like(b, 2, r))));
  Value result = b.binary("divide", b.select(b.compare(Cmp::EQ, r, zero), zero, fixed), inv);

  // hypot's special values, as CPU: inf when either part is infinite (even
  // beside a NaN), else NaN when either part is NaN.
  Value inf = splat_like(b, INFINITY, result), either = add(re, im);
  result = b.select(b.compare(Cmp::NE, either, either), either, result);
  return b.select(b.binary("or", b.compare(Cmp::EQ, re, inf), b.compare(Cmp::EQ, im, inf)), inf, result);
}

Value complex_abs(Builder& b, const Value& z) {
  TensorType real{real_dtype(z.dtype()), z.shape()};
  return hypot_as_cpu(b, b.op("stablehlo.real", {z}, real), b.op("stablehlo.imag", {z}, real));
}

}  // namespace torch_pjrt::lowering::ops
