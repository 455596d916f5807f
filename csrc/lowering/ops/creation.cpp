// Factories whose values are not a constant fill: arange, linspace, eye.
// (zeros/ones/full/empty and the *_like variants are empty + fill_.)
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// The type PyTorch's CPU kernels accumulate in (acc_type<T, false>): double for
// float/double, float for half types, int64 for integers.
DType cpu_acc_type(DType t) {
  if (t == DType::F16 || t == DType::BF16) return DType::F32;
  return is_float(t) ? DType::F64 : DType::I64;
}

Value index_iota(Builder& b, const TensorType& out, DType dt) {
  return b.iota(TensorType{dt, out.shape}, 0);
}

// arange(start, end, step): start + i * step in the accumulation type.
std::vector<Value> arange(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  DType acc = cpu_acc_type(out.dtype);
  Value i = index_iota(b, out, acc);
  Value start = b.splat(ctx.scalar("start"), TensorType{acc, out.shape});
  Value step = b.splat(ctx.scalar("step", Scalar::from_int(1)), TensorType{acc, out.shape});
  return {b.binary("add", start, b.binary("multiply", i, step))};
}

// PyTorch's formula: start + step*i for the first half and end - step*(n-1-i)
// for the second, with step rounded to the output type (double for integers)
// and, as its CPU kernel is compiled, each product-sum fused (rounded once).
// The products and sums are formed in float64, exact for float32 and narrower
// (a 24-bit step times an index below 2^29), so only the final conversion rounds.
std::vector<Value> linspace(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  int64_t n = out.numel();
  if (n == 0) return {b.zeros(out)};
  DType dt = is_float(out.dtype) ? out.dtype : DType::F64;
  // start/end are first rounded to the output type, as scalar_start.to<scalar_t>().
  auto endpoint = [&](const char* name) {
    Value v = b.convert(b.broadcast_to(ctx.operand(name, DType::F64), {}), out.dtype);
    return b.convert(v, dt);
  };
  Value start = endpoint("start"), end = endpoint("end");
  if (n == 1) return {b.broadcast_to(start, out.shape)};
  Value step = b.binary("divide", b.binary("subtract", end, start), b.constant_int(n - 1, dt));
  auto wide = [&](const Value& v) { return b.broadcast_to(b.convert(v, DType::F64), out.shape); };
  Value i = index_iota(b, out, DType::F64);
  Value rev = b.binary("subtract", b.splat(Scalar::from_int(n - 1), i.type), i);
  Value lo = b.binary("add", wide(start), b.binary("multiply", wide(step), i));
  Value hi = b.binary("subtract", wide(end), b.binary("multiply", wide(step), rev));
  Value first = b.compare(Cmp::LT, index_iota(b, out, DType::I64),
                          b.splat(Scalar::from_int(n / 2), TensorType{DType::I64, out.shape}));
  return {b.select(first, lo, hi)};
}

std::vector<Value> eye(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  TensorType it{DType::I64, out.shape};
  return {b.convert(b.compare(Cmp::EQ, b.iota(it, 0), b.iota(it, 1)), out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("arange", arange);
TORCH_PJRT_LOWERING("linspace", linspace);
TORCH_PJRT_LOWERING("eye", eye);

}  // namespace torch_pjrt::lowering::ops
