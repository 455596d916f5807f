// More elementwise binary functions: atan2, hypot, logaddexp/logaddexp2,
// fmax/fmin, copysign, heaviside, xlog1py, zeta, nextafter and linalg_cross, with
// the special values of PyTorch's CPU kernels. Computed in the output's math dtype
// (float32 for half types, rounded once), operands broadcast to the output.
#include <cmath>
#include <string>
#include <utility>

#include "lowering/ops/common.h"
#include "lowering/ops/hurwitz.h"

namespace torch_pjrt::lowering::ops {

namespace {

struct Pair {
  Value a, o;
  DType out;
};

// self and other in the output's math dtype and shape (each cast to the
// output dtype first, as CPU's kernels receive them).
Pair operands(LoweringContext& ctx, const char* second = "other") {
  const TensorType& out = ctx.out();
  return {operand_rounded(ctx, "self", out.dtype, out.shape), operand_rounded(ctx, second, out.dtype, out.shape),
          out.dtype};
}

// CPU's kernels of these ops dispatch on float dtypes only.
void floats_only(LoweringContext& ctx, const char* kernel) {
  DType t = ctx.out().dtype;
  if (!is_float(t)) ctx.kernel_not_implemented(kernel, t);
}

Value is_nan(Builder& b, const Value& x) { return b.compare(Cmp::NE, x, x); }

std::vector<Value> atan2(LoweringContext& ctx) {
  Pair p = operands(ctx);
  return {ctx.b.convert(ctx.b.binary("atan2", p.a, p.o), p.out)};
}

// hypot, as std::hypot rounds it (hypot.cpp): inf when either is infinite
// (even beside NaN).
std::vector<Value> hypot(LoweringContext& ctx) {
  floats_only(ctx, "hypot_cpu");
  Pair p = operands(ctx);
  return {ctx.b.convert(hypot_as_cpu(ctx.b, p.a, p.o), p.out)};
}

// logaddexp = m + log1p(exp(-|a - b|)) for m = max(a, b); a when a == b is
// infinite (inf - inf would be NaN). Base 2: log1p(2^-|a - b|) / ln 2.
std::vector<Value> logaddexp(LoweringContext& ctx, bool base2) {
  Builder& b = ctx.b;
  if (!base2 && is_complex(ctx.out().dtype)) {  // (CPU's complex kernel: complex_math.cpp)
    Pair p = operands(ctx);
    return {complex_logaddexp(b, p.a, p.o)};
  }
  floats_only(ctx, base2 ? "logaddexp2_cpu" : "logaddexp_cpu");
  Pair p = operands(ctx);
  Value m = b.select(b.compare(Cmp::GT, p.a, p.o), p.a, p.o);
  Value d = b.unary("negate", b.unary("abs", b.binary("subtract", p.a, p.o)));
  Value r = base2 ? b.binary("multiply", b.unary("log_plus_one", b.unary("exponential", b.binary("multiply", d, splat_like(b, M_LN2, d)))),
                             splat_like(b, 1.0 / M_LN2, d))
                  : b.unary("log_plus_one", b.unary("exponential", d));
  r = b.binary("add", m, r);
  Value same_inf = b.binary("and", b.compare(Cmp::EQ, p.a, p.o),
                            b.compare(Cmp::EQ, b.unary("abs", p.a), splat_like(b, INFINITY, p.a)));
  return {b.convert(b.select(same_inf, p.a, r), p.out)};
}

// fmax/fmin: NaN only where both are NaN; self on ties (fmax(-0.0, 0.0) is
// -0.0, as on CPU).
std::vector<Value> fmax_fmin(LoweringContext& ctx, Cmp dir) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value a = operand_as(ctx, "self", out.dtype, out.shape), o = operand_as(ctx, "other", out.dtype, out.shape);
  if (out.dtype == DType::Bool) return {b.binary(dir == Cmp::GT ? "or" : "and", a, o)};
  Value take_o = b.compare(dir, o, a);
  if (is_float(out.dtype)) take_o = b.binary("or", take_o, is_nan(b, a));
  return {b.select(take_o, o, a)};
}

// copysign: |self| with the sign bit of other (-0.0 and negative NaN count).
std::vector<Value> copysign(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Pair p = operands(ctx);
  Value mag = b.unary("abs", p.a);
  return {b.convert(b.select(signbit(b, p.o), b.unary("negate", mag), mag), p.out)};
}

// heaviside(x, values): values where x == 0, else x > 0 (NaN gives 0).
std::vector<Value> heaviside(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value x = operand_as(ctx, "self", out.dtype, out.shape), v = operand_as(ctx, "values", out.dtype, out.shape);
  Value zero = b.zeros(x.type);
  Value step = b.convert(b.compare(Cmp::GT, x, zero), out.dtype);
  return {b.select(b.compare(Cmp::EQ, x, zero), v, step)};
}

// xlog1py(x, y) = x log1p(y), 0 where x == 0, NaN where y is NaN.
std::vector<Value> xlog1py(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Pair p = operands(ctx);
  // (log1p rounded to a half type first: CPU's std::log1p of a c10 half returns one.)
  Value r = b.binary("multiply", p.a, rounded_to(b, b.unary("log_plus_one", p.o), p.out));
  r = b.select(b.compare(Cmp::EQ, p.a, splat_like(b, 0, p.a)), splat_like(b, 0, p.a), r);
  r = b.select(is_nan(b, p.o), p.o, r);
  return {b.convert(r, p.out)};
}

// Hurwitz zeta(x, q) (CHLO's), with CPU's (Cephes') domain rules: inf at
// x == 1, NaN for x < 1; for q <= 0, inf at an integer q and NaN for a
// non-integer x; the first term alone for a huge x.
std::vector<Value> zeta(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Pair p = operands(ctx);
  const Value &x = p.a, &q = p.o;
  auto is_int = [&](const Value& v) { return b.compare(Cmp::EQ, v, b.unary("floor", v)); };
  // CHLO's series is right for q above about 1 only (zeta(5, -10.3) was
  // -2.8e22, CPU -405.8): q < 1 (an integer x where q < 0) is first moved up
  // to [1, 2) by zeta(x, q) = zeta(x, q + 1) + q^-x, in float64.
  Value x64 = b.convert(x, DType::F64), q64 = b.convert(q, DType::F64);
  Value shift = b.binary("and", b.compare(Cmp::GE, x, splat_like(b, 1, x)),
                         b.binary("or", b.compare(Cmp::GT, q, splat_like(b, 0, q)), is_int(x)));
  HurwitzShift h = hurwitz_shift(b, x64, q64, shift);
  Value shifted = b.binary("add", b.op("chlo.zeta", {x64, h.q}, x64.type), h.sum);
  shifted = b.convert(b.select(h.unfinished, splat_like(b, NAN, shifted), shifted), x.dtype());
  Value r = b.select(b.compare(Cmp::LT, q, splat_like(b, 1, q)), shifted, b.op("chlo.zeta", {x, q}, x.type));
  // Past x = 1000 the first term q^-x is the sum (the next is (1 + 1/q)^-x
  // of it, or all underflow), as CPU's series stops there; CHLO's is NaN
  // from x = 3300 in float32 and at an infinite x.
  Value first = b.binary("power", q, b.unary("negate", x));
  r = b.select(b.binary("and", b.compare(Cmp::GT, x, splat_like(b, 1000, x)), b.compare(Cmp::GT, q, splat_like(b, 0, q))),
               first, r);
  Value q_le0 = b.compare(Cmp::LE, q, splat_like(b, 0, q));
  r = b.select(b.binary("and", q_le0, b.unary("not", is_int(x))), splat_like(b, NAN, r), r);
  r = b.select(b.binary("and", q_le0, is_int(q)), splat_like(b, INFINITY, r), r);
  r = b.select(b.compare(Cmp::LT, x, splat_like(b, 1, x)), splat_like(b, NAN, r), r);
  r = b.select(b.compare(Cmp::EQ, x, splat_like(b, 1, x)), splat_like(b, INFINITY, r), r);
  return {b.convert(r, p.out)};
}

// nextafter steps in the output dtype itself (a half's next value is not
// float32's).
std::vector<Value> nextafter(LoweringContext& ctx) {
  floats_only(ctx, "nextafter_cpu");
  const TensorType& out = ctx.out();
  Value a = operand_as(ctx, "self", out.dtype, out.shape), o = operand_as(ctx, "other", out.dtype, out.shape);
  return {ctx.b.op("chlo.next_after", {a, o}, out)};
}

// linalg_cross(self, other, dim): the cross product of 3-vectors along dim
// (the Meta kernel checks its size), operands broadcast to the result.
std::vector<Value> cross(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value x = operand_as(ctx, "self", out.dtype, out.shape), y = operand_as(ctx, "other", out.dtype, out.shape);
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), x.rank());
  auto part = [&](const Value& v, int64_t i) {
    Shape start(v.rank(), 0), limit = v.shape();
    start[dim] = i;
    limit[dim] = i + 1;
    return b.slice(v, start, limit);
  };
  auto term = [&](int64_t i, int64_t j) {
    return b.binary("subtract", b.binary("multiply", part(x, i), part(y, j)), b.binary("multiply", part(x, j), part(y, i)));
  };
  return {b.concatenate({term(1, 2), term(2, 0), term(0, 1)}, dim)};
}

// ldexp(self, other) of an integer `other`: self * 2^other rounded once, as
// CPU's std::ldexp. (PyTorch's composite, self * pow(2, other), overflows
// 2^other first: 1e-30 * 2^150 was inf, 0 * 2^200 NaN.) The exponent,
// clamped to where every result has saturated, is applied as three powers of
// two that are each a normal number. (A float `other` takes that composite,
// as CPU's kernel does.)
std::vector<Value> ldexp(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = math_dtype(out.dtype);
  bool f64 = dt == DType::F64;
  int mant = f64 ? 52 : 23, bias = f64 ? 1023 : 127, limit = f64 ? 2100 : 300;
  DType it = f64 ? DType::I64 : DType::I32;
  Value x = operand_as(ctx, "self", dt, out.shape);
  if (!is_integral(ctx.tensor("other").dtype(), /*include_bool=*/true))  // (CPU: self * pow(2, other))
    return {b.convert(b.binary("multiply", x, b.binary("power", splat_like(b, 2, x), operand_as(ctx, "other", dt, out.shape))),
                      out.dtype)};
  Value o = operand_as(ctx, "other", DType::I64, out.shape);
  Value e = b.convert(b.op("stablehlo.clamp", {splat_like(b, -limit, o), o, splat_like(b, limit, o)}, o.type), it);
  auto k = [&](int64_t v) { return b.splat(Scalar::from_int(v), TensorType{it, out.shape}); };
  auto pow2 = [&](const Value& part) {  // 2^part for part in the normal exponents
    return b.bitcast_convert(b.op("stablehlo.shift_left", {b.binary("add", part, k(bias)), k(mant)}, part.type),
                             TensorType{dt, out.shape});
  };
  Value e1 = b.binary("divide", e, k(3));
  Value e2 = b.binary("divide", b.binary("subtract", e, e1), k(2));
  Value e3 = b.binary("subtract", b.binary("subtract", e, e1), e2);
  Value r = b.binary("multiply", b.binary("multiply", b.binary("multiply", x, pow2(e1)), pow2(e2)), pow2(e3));
  if (!is_float(ctx.tensor("self").dtype())) {
    // CPU's kernel for an integer self: self * pow(2.0, other) in float32,
    // where 2^other is inf above 2^127 (0 * 2^200 is NaN) and 0 below 2^-149.
    Value p2 = b.select(b.compare(Cmp::GT, o, splat_like(b, bias, o)), splat_like(b, INFINITY, x),
                        b.select(b.compare(Cmp::LT, o, splat_like(b, -bias - mant + 1, o)), splat_like(b, 0, x),
                                 splat_like(b, 1, x)));
    r = b.select(b.compare(Cmp::EQ, p2, splat_like(b, 1, x)), r, b.binary("multiply", x, p2));
  }
  return {b.convert(r, out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("linalg_cross", cross);
TORCH_PJRT_LOWERING("ldexp", ldexp);
TORCH_PJRT_LOWERING("atan2", atan2);
TORCH_PJRT_LOWERING("arctan2", atan2);
TORCH_PJRT_LOWERING("hypot", hypot);
TORCH_PJRT_LOWERING("logaddexp", [](LoweringContext& c) { return logaddexp(c, false); });
TORCH_PJRT_LOWERING("logaddexp2", [](LoweringContext& c) { return logaddexp(c, true); });
TORCH_PJRT_LOWERING("fmax", [](LoweringContext& c) { return fmax_fmin(c, Cmp::GT); });
TORCH_PJRT_LOWERING("fmin", [](LoweringContext& c) { return fmax_fmin(c, Cmp::LT); });
TORCH_PJRT_LOWERING("copysign", copysign);
TORCH_PJRT_LOWERING("heaviside", heaviside);
TORCH_PJRT_LOWERING("special_xlog1py", xlog1py);
TORCH_PJRT_LOWERING("nextafter", nextafter);
TORCH_PJRT_LOWERING("special_zeta", zeta);

}  // namespace torch_pjrt::lowering::ops
