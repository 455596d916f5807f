#include "lowering/ops/common.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace torch_pjrt::lowering::ops {

DType compute_dtype(const LoweringContext& ctx, const std::string& a, const std::string& b) {
  return result_type({ctx.promotion(a), ctx.promotion(b)}, ctx.default_float);
}

Value operand_as(LoweringContext& ctx, const std::string& name, DType dtype, const Shape& shape) {
  return ctx.b.broadcast_to(ctx.operand(name, dtype), shape);
}

Value operand_rounded(LoweringContext& ctx, const std::string& name, DType out, const Shape& shape) {
  DType dt = math_dtype(out);
  if (dt == out) return operand_as(ctx, name, dt, shape);
  return ctx.b.convert(operand_as(ctx, name, out, shape), dt);
}

Value splat_like(Builder& b, double v, const Value& like) {
  return b.splat(is_float(like.dtype()) || is_complex(like.dtype()) ? Scalar::from_float(v) : Scalar::from_int(int64_t(v)), like.type);
}

void check_matrix_product(const LoweringContext& ctx, const Shape& a, const Shape& b, int64_t b_inner) {
  if (a.size() != 2 || b.size() != 2 || a[1] != b[b_inner])
    ctx.fail("mat1 and mat2 shapes cannot be multiplied (" + std::to_string(a.at(0)) + "x" +
             std::to_string(a.at(1)) + " and " + std::to_string(b.at(0)) + "x" + std::to_string(b.at(1)) + ")");
}

DType math_dtype(DType out) {
  return out == DType::F16 || out == DType::BF16 || is_float8(out) ? DType::F32 : out;
}

Value rounded_to(Builder& b, const Value& v, DType t) {
  return v.dtype() == t ? v : b.convert(b.convert(v, t), v.dtype());
}

std::vector<Value> float_unary(LoweringContext& ctx,
                               const std::function<Value(Builder&, const Value&)>& fn) {
  DType out = ctx.out().dtype;
  Value x = ctx.b.convert(ctx.tensor("self"), math_dtype(out));
  return {ctx.b.convert(fn(ctx.b, x), out)};
}

// erfc: CHLO's, times exp(-(x*x - fl(x*x))) for 1 <= x < 30. CHLO's tail
// is exp(-x*x) * P(1/x), and the rounding of x*x cost up to 64 ulps in
// float32 (8 <= x < 9.2) and 509 in float64 (20 <= x < 26); CPU: 1. The
// residual of x*x is exact by Dekker's split (hi and lo of half the bits
// each: their products are exact), which brings the tail to 4-7 ulps.
Value erfc(Builder& b, const Value& x) {
  Value r = b.op("chlo.erfc", {x}, x.type);
  auto mul = [&](const Value& p, const Value& q) { return b.binary("multiply", p, q); };
  auto sub = [&](const Value& p, const Value& q) { return b.binary("subtract", p, q); };
  Value t = mul(x, splat_like(b, x.dtype() == DType::F64 ? 134217729.0 : 4097.0, x));
  Value hi = sub(t, sub(t, x)), lo = sub(x, hi);
  Value resid = b.binary("add", b.binary("add", sub(mul(hi, hi), mul(x, x)), mul(splat_like(b, 2, x), mul(hi, lo))),
                         mul(lo, lo));
  Value fixed = mul(r, b.unary("exponential", b.unary("negate", resid)));
  Value tail = b.binary("and", b.compare(Cmp::GE, x, splat_like(b, 1, x)), b.compare(Cmp::LT, x, splat_like(b, 30, x)));
  return b.select(tail, fixed, r);
}

// ±1 exactly where erf rounds to ±1 in the type (|x| >= 3.92 in float32,
// 5.93 in float64): XLA:CPU's fusion emitters' erf stops short there
// (-0.99999982 for every x below -3.7), so gelu(-1e6) gave -0.089, not -0,
// in a large program.
Value erf(Builder& b, const Value& x) {
  // Clamped: in float32 chlo.erf passes 1 by up to 2 ulps on 3.72 <= |x| < 3.92
  // (Normal.cdf then went negative, and its log NaN).
  // (select: XLA:CPU's maximum drops a NaN)
  Value r = b.op("chlo.erf", {x}, x.type), one = splat_like(b, 1, x);
  r = b.select(b.compare(Cmp::GT, b.unary("abs", r), one), b.unary("sign", r), r);
  if (x.dtype() == DType::F32) {
    // From |x| = 1 on, 1 - erfc(|x|) (at most 1.3 ulps): chlo.erf was up to
    // 5.3 ulps off there (CPU 0.55), which ndtr and the exact gelu magnify
    // in their tails (ndtr(-5.3) was 3x the true value).
    Value ax = b.unary("abs", x);
    Value tail = b.binary("subtract", one, erfc(b, ax));
    tail = b.select(b.compare(Cmp::LT, x, splat_like(b, 0, x)), b.unary("negate", tail), tail);
    r = b.select(b.compare(Cmp::GE, ax, splat_like(b, 1, x)), tail, r);
  }
  Value big = b.compare(Cmp::GE, b.unary("abs", x), splat_like(b, x.dtype() == DType::F64 ? 5.93 : 3.92, x));
  return b.select(big, b.unary("sign", x), r);  // (NaN: the compare is false)
}

Value gelu_value(Builder& b, const Value& x, bool tanh_approximation) {
  Value half = splat_like(b, 0.5, x), one = splat_like(b, 1, x);
  Value inner;
  if (tanh_approximation) {
    Value x3 = b.binary("multiply", b.binary("multiply", x, x), x);
    Value t = b.binary("add", x, b.binary("multiply", splat_like(b, 0.044715, x), x3));
    inner = b.unary("tanh", b.binary("multiply", splat_like(b, std::sqrt(2.0 / M_PI), x), t));
  } else {
    inner = erf(b, b.binary("multiply", x, splat_like(b, M_SQRT1_2, x)));
  }
  return b.binary("multiply", b.binary("multiply", half, x), b.binary("add", one, inner));
}

Value softmax_along(Builder& b, const Value& x, int64_t dim, bool log) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) kept.push_back(i);
  double inf = std::numeric_limits<double>::infinity();
  Value m = b.reduce(x, b.constant(-inf, x.dtype()), {dim}, "stablehlo.maximum");
  Value shifted = b.binary("subtract", x, b.broadcast_in_dim(m, x.shape(), kept));
  Value e = b.unary("exponential", shifted);
  Value s = b.broadcast_in_dim(b.reduce(e, b.constant(0.0, x.dtype()), {dim}, "stablehlo.add"), x.shape(), kept);
  return log ? b.binary("subtract", shifted, b.unary("log", s)) : b.binary("divide", e, s);
}

Value floor_divide(Builder& b, const Value& a, const Value& d) {
  if (is_float(a.dtype())) {
    // PyTorch's div_floor_floating, not floor(a / d): the quotient of what
    // fmod leaves, one less where the signs differ (-3 // inf is -1, as in
    // Python), rounded to the nearest integer, a signed zero when it is 0,
    // and IEEE's a / d for a zero divisor.
    Value zero = splat_like(b, 0, a), one = splat_like(b, 1, a);
    Value q = b.binary("divide", a, d);
    Value mod = b.binary("remainder", a, d);
    Value div = b.binary("divide", b.binary("subtract", a, mod), d);
    Value signs_differ = b.compare(Cmp::NE, b.compare(Cmp::LT, d, zero), b.compare(Cmp::LT, mod, zero));
    Value adjust = b.binary("and", b.compare(Cmp::NE, mod, zero), signs_differ);
    div = b.select(adjust, b.binary("subtract", div, one), div);
    Value fl = b.unary("floor", div);
    fl = b.select(b.compare(Cmp::GT, b.binary("subtract", div, fl), splat_like(b, 0.5, a)), b.binary("add", fl, one), fl);
    Value signed_zero = b.binary("multiply", zero, q);
    Value r = b.select(b.compare(Cmp::NE, div, zero), fl, signed_zero);
    return b.select(b.compare(Cmp::EQ, d, zero), q, r);
  }
  // Integer: truncating division, minus one where the signs differ and it is inexact.
  Value q = b.binary("divide", a, d);
  if (is_unsigned(a.dtype()) || a.dtype() == DType::Bool) return q;
  Value zero = splat_like(b, 0, a);
  Value r = b.binary("remainder", a, d);
  Value inexact = b.compare(Cmp::NE, r, zero);
  Value signs_differ = b.compare(Cmp::NE, b.compare(Cmp::LT, a, zero), b.compare(Cmp::LT, d, zero));
  Value adjust = b.binary("and", inexact, signs_differ);
  return b.select(adjust, b.binary("subtract", q, splat_like(b, 1, q)), q);
}

Value python_remainder(Builder& b, const Value& a, const Value& d) {
  // C remainder, then shifted by the divisor where the signs differ.
  Value r = b.binary("remainder", a, d);
  if (is_unsigned(a.dtype())) return r;
  Value zero = splat_like(b, 0, a);
  Value nonzero = b.compare(Cmp::NE, r, zero);
  Value signs_differ = b.compare(Cmp::NE, b.compare(Cmp::LT, r, zero), b.compare(Cmp::LT, d, zero));
  return b.select(b.binary("and", nonzero, signs_differ), b.binary("add", r, d), r);
}

std::pair<double, double> integer_range(DType t) {
  int bits = 8 * int(itemsize(t));
  if (is_unsigned(t)) return {0.0, std::ldexp(1.0, bits) - 1};
  return {-std::ldexp(1.0, bits - 1), std::ldexp(1.0, bits - 1) - 1};
}

namespace {
// The C++ type CPU's overflow message names ("int8_t", "c10::Half").
const char* cpp_type_name(DType t) {
  switch (t) {
    case DType::I8: return "int8_t";
    case DType::I16: return "int16_t";
    case DType::I32: return "int";
    case DType::I64: return "int64_t";
    case DType::U8: return "uint8_t";
    case DType::F16: return "c10::Half";
    case DType::BF16: return "c10::BFloat16";
    case DType::F32: return "float";
    default: return dtype_name(t);
  }
}
}  // namespace

void check_scalar_fits(const LoweringContext& ctx, const std::string& name, DType t, bool floats) {
  // (TORCH_PJRT_CPU_CHECKS=off, eager's escape hatch from CPU's checks, skips this one too)
  static const bool enabled = [] {
    const char* v = std::getenv("TORCH_PJRT_CPU_CHECKS");
    return !v || std::string(v) != "off";
  }();
  const Arg* a = ctx.find(name);
  if (!enabled || !a || a->dynamic) return;
  // (A wrapped number's value: graph_bindings.cpp keeps it; eager's probe of CPU checks those.)
  bool wrapped = a->kind == Arg::Tensor && a->wrapped_number;
  if (a->kind != Arg::Int && a->kind != Arg::Float && !wrapped) return;
  bool is_int = a->scalar.kind == Scalar::Int;
  double v = is_int ? double(a->scalar.i) : a->scalar.to_double();
  bool bad = false;
  if (is_integral(t, /*include_bool=*/false) && itemsize(t) < 8) {
    auto [lo, hi] = integer_range(t);
    if (is_int && is_unsigned(t)) lo = -hi;  // (c10::overflows lets -1 wrap)
    bad = v < lo || v > hi || std::isnan(v);  // (CPU's checked conversion refuses NaN too)
  } else if (is_integral(t, /*include_bool=*/false)) {
    // 8 bytes (c10::overflows): a Python int past int64's max, or a float
    // beyond the type (infinities too), does not convert; a negative int
    // wraps into uint64.
    if (a->scalar.kind == Scalar::UInt)
      bad = t == DType::I64 && static_cast<uint64_t>(a->scalar.i) > uint64_t(INT64_MAX);
    else if (!is_int)
      bad = std::isnan(v) || (t == DType::I64 ? (v < -9223372036854775808.0 || v > 9223372036854775807.0)
                                              : (v < 0 || v > 18446744073709551615.0));
  } else if (floats && (t == DType::F16 || t == DType::BF16 || t == DType::F32)) {
    bad = std::isfinite(v) && std::abs(v) > largest_finite(t);  // (infinities convert)
  }
  if (bad) ctx.fail(std::string("value cannot be converted to type ") + cpp_type_name(t) + " without overflow");
}

double largest_finite(DType t) {
  switch (t) {
    case DType::F16: return 65504.0;
    case DType::BF16: return 3.3895313892515355e38;
    case DType::F8E4M3FN: return 448.0;
    case DType::F8E5M2: case DType::F8E5M2FNUZ: return 57344.0;
    case DType::F8E4M3FNUZ: return 240.0;
    case DType::F32: return std::numeric_limits<float>::max();
    default: return std::numeric_limits<double>::max();
  }
}

}  // namespace torch_pjrt::lowering::ops
