// Factories whose values are not a constant fill: arange, linspace, logspace, eye.
// (zeros/ones/full/empty and the *_like variants are empty + fill_.)
#include <cmath>
#include <utility>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// The type PyTorch's CPU kernels accumulate in (acc_type<T, false>): double for
// float/double, float for half types, int64 for integers.
DType cpu_acc_type(DType t) {
  if (t == DType::F16 || t == DType::BF16) return DType::F32;
  return is_float(t) ? DType::F64 : DType::I64;
}

// arange(start, end, step): start + i * step in the accumulation type.
std::vector<Value> arange(LoweringContext& ctx, const TensorType& out) {
  Builder& b = ctx.b;
  if (out.numel() == 0) return {b.zeros(out)};
  DType acc = cpu_acc_type(out.dtype);
  for (const char* name : {"start", "end", "step"})  // (CPU reads each as its accumulation type: 2**63 overflows)
    check_scalar_fits(ctx, name, acc);
  Value i = b.iota(TensorType{acc, out.shape}, 0);
  // (start through operand: a runtime input where the graph passes one,
  // x[n:n+k]-style positions in a compiled graph; the length is out's.)
  Value start = ctx.has("start") ? b.broadcast_to(ctx.operand("start", acc), out.shape)
                                 : b.splat(Scalar::from_int(0), TensorType{acc, out.shape});
  Value step = b.splat(ctx.scalar("step", Scalar::from_int(1)), TensorType{acc, out.shape});
  return {b.binary("add", start, b.binary("multiply", i, step))};
}

// c + x*i rounded (nearly always) once, as an FMA would, in float64, for an
// integer-valued i below 2^26: x is split into two halves of at most 27 significant bits
// (masking mantissa bits, not Veltkamp's multiply, which XLA could contract),
// so both partial products are exact and c + x*i = s + t + x_lo*i exactly.
Value fma_f64(Builder& b, const Value& x, const Value& i, const Value& c) {
  auto add = [&](const Value& u, const Value& v) { return b.binary("add", u, v); };
  auto sub = [&](const Value& u, const Value& v) { return b.binary("subtract", u, v); };
  TensorType it{DType::I64, x.shape()};
  Value bits = b.bitcast_convert(x, it);
  Value x_hi = b.bitcast_convert(b.binary("and", bits, b.splat(Scalar::from_int(~int64_t(0x7FFFFFF)), it)), x.type);
  Value x_lo = sub(x, x_hi);
  Value a = b.binary("multiply", x_hi, i);
  Value s = add(c, a);  // Knuth's two-sum: s + t == c + a exactly
  Value bb = sub(s, c);
  Value t = add(sub(c, sub(s, bb)), sub(a, bb));
  return add(s, add(t, b.binary("multiply", x_lo, i)));
}

// PyTorch's formula: start + step*i for the first half and end - step*(n-1-i)
// for the second, step in the output type (double for integers). Its CPU
// kernel, as compiled, fuses each product-sum (one rounding); half types go
// through c10::Half operators instead, rounding after every operation.
std::vector<Value> linspace(LoweringContext& ctx, const TensorType& out) {
  Builder& b = ctx.b;
  int64_t n = out.numel();
  if (n == 0) return {b.zeros(out)};
  bool half = out.dtype == DType::F16 || out.dtype == DType::BF16;
  DType dt = is_float(out.dtype) ? out.dtype : DType::F64;
  DType wt = half ? DType::F32 : DType::F64;  // the type operations are carried out in
  // Rounds a wt value to the output precision, as each operation on scalar_t does.
  auto round = [&](const Value& v) { return rounded_to(b, v, dt); };
  // start/end are first converted to the output type, as Scalar::to<scalar_t>()
  // does: integer scalars wrap into integer outputs, out-of-range values raise.
  auto endpoint = [&](const char* name) {
    // Endpoints are build-time constants: XLA folds them exactly, as PyTorch's
    // host arithmetic does (runtime f64 math may differ in the last bit).
    if (ctx.arg(name).kind != Arg::Tensor) (void)ctx.scalar(name);
    const Arg& a = ctx.arg(name);
    bool int_scalar = a.kind == Arg::Int || a.kind == Arg::Bool ||
                      (a.kind == Arg::Tensor && !is_float(a.tensor.dtype()));
    if (is_integral(out.dtype, false)) check_scalar_fits(ctx, name, out.dtype);
    Value v = ctx.operand(name, int_scalar ? DType::I64 : DType::F64);
    v = b.convert(b.reshape(v, {}), out.dtype);
    return b.convert(b.convert(v, dt), wt);
  };
  Value start = endpoint("start"), end = endpoint("end");
  if (n == 1) return {b.broadcast_to(start, out.shape)};
  Value steps = round(b.constant_int(n - 1, wt));
  Value step = round(b.binary("divide", round(b.binary("subtract", end, start)), steps));
  auto full = [&](const Value& v) { return b.broadcast_to(v, out.shape); };
  Value i = b.iota(TensorType{wt, out.shape}, 0);
  Value rev = b.binary("subtract", b.splat(Scalar::from_int(n - 1), i.type), i);
  Value lo, hi;
  if (half) {
    auto term = [&](const Value& idx) { return round(b.binary("multiply", full(step), round(idx))); };
    lo = round(b.binary("add", full(start), term(i)));
    hi = round(b.binary("subtract", full(end), term(rev)));
  } else {
    lo = fma_f64(b, full(step), i, full(start));
    hi = fma_f64(b, b.unary("negate", full(step)), rev, full(end));
  }
  Value first = b.compare(Cmp::LT, b.iota(TensorType{DType::I64, out.shape}, 0),
                          b.splat(Scalar::from_int(n / 2), TensorType{DType::I64, out.shape}));
  return {b.select(first, lo, hi)};
}

// logspace: base ** e for e = start + step*i in the first half and
// end - step*(n-1-i) in the second, as CPU's kernel: start and end in the
// output type, their difference rounded to it, the exponents and the power in
// float64 (float32 with a float32 base for integer outputs), then rounded.
std::vector<Value> logspace(LoweringContext& ctx, const TensorType& out) {
  Builder& b = ctx.b;
  int64_t n = out.numel();
  if (n == 0) return {b.zeros(out)};
  // (complex: computed as its part type, real ends)
  DType et = real_dtype(out.dtype);
  bool integral = !is_float(et);
  DType wt = integral ? DType::F32 : DType::F64;
  double base = ctx.to_double("base", 10.0);
  auto endpoint = [&](const char* name) {
    const Arg& a = ctx.arg(name);
    bool int_scalar = a.kind == Arg::Int || a.kind == Arg::Bool ||
                      (a.kind == Arg::Tensor && !is_float(a.tensor.dtype()));
    Value v = b.convert(b.reshape(ctx.operand(name, int_scalar ? DType::I64 : DType::F64), {}), et);
    return v;  // in the output type
  };
  Value start_t = endpoint("start"), end_t = endpoint("end");
  auto full = [&](const Value& v) { return b.broadcast_to(v, out.shape); };
  Value base_v = b.splat(Scalar::from_float(integral ? double(float(base)) : base), TensorType{wt, out.shape});
  Value start = b.convert(start_t, wt);
  if (n == 1) return {b.convert(b.binary("power", base_v, full(start)), out.dtype)};
  Value diff = b.convert(b.binary("subtract", end_t, start_t), wt);  // (rounded to the output type)
  // (Integer outputs: diff times 1 / (n - 1) in float32, what CPU's results
  // were matched with before constant divisors became true divisions.)
  Value step = integral ? b.binary("multiply", diff, b.constant(double(1.0f / float(n - 1)), wt))
                        : b.binary("divide", diff, b.constant_int(n - 1, wt));
  Value end = b.convert(end_t, wt);
  Value i = b.iota(TensorType{wt, out.shape}, 0);
  Value rev = b.binary("subtract", b.splat(Scalar::from_int(n - 1), i.type), i);
  Value lo, hi;
  if (integral) {
    lo = b.binary("add", full(start), b.binary("multiply", full(step), i));
    hi = b.binary("subtract", full(end), b.binary("multiply", full(step), rev));
  } else {
    lo = fma_f64(b, full(step), i, full(start));
    hi = fma_f64(b, b.unary("negate", full(step)), rev, full(end));
  }
  Value first = b.compare(Cmp::LT, b.iota(TensorType{DType::I64, out.shape}, 0),
                          b.splat(Scalar::from_int(n / 2), TensorType{DType::I64, out.shape}));
  return {b.convert(b.binary("power", base_v, b.select(first, lo, hi)), out.dtype)};
}

// Computed as a 1-d sequence, then laid out row-major in the result: an out=
// tensor of another shape but as many elements keeps its shape, as CPU's
// arange_out/linspace_out resize only on a different count (plan_build.cpp).
template <std::vector<Value> (*Fn)(LoweringContext&, const TensorType&)>
std::vector<Value> sequence(LoweringContext& ctx) {
  const TensorType& out = ctx.out();
  TensorType flat{out.dtype, {out.numel()}};
  return {ctx.b.reshape(Fn(ctx, flat)[0], out.shape)};
}

std::vector<Value> eye(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  TensorType it{DType::I64, out.shape};
  return {b.convert(b.compare(Cmp::EQ, b.iota(it, 0), b.iota(it, 1)), out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("arange", sequence<arange>);
TORCH_PJRT_LOWERING("linspace", sequence<linspace>);
TORCH_PJRT_LOWERING("logspace", sequence<logspace>);
TORCH_PJRT_LOWERING("eye", eye);

}  // namespace torch_pjrt::lowering::ops
