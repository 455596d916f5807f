// Cumulative ops along one dim: cumsum, cumprod, logcumsumexp, cummax and
// cummin. A log-step
// (Hillis-Steele) inclusive scan: step s combines each element with the one s
// places before it (identity padding at the front), s = 1, 2, 4, ... This is
// ceil(log2 n) elementwise passes on every backend, where a reduce_window scan
// costs O(n * window) on XLA's CPU and GPU backends. Float rounding differs
// from the CPU kernels' sequential sum by the usual reassociation error. Half
// types accumulate in float32 like the CPU kernels.
#include <cmath>
#include <functional>
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

Value inclusive_scan(Builder& b, const Value& x, int64_t dim, double identity, const Combine& combine) {
  int64_t n = x.shape()[dim];
  Value acc = x;
  Value pad_value = b.constant(identity, x.dtype());
  Shape zeros(x.rank(), 0), start(x.rank(), 0);
  for (int64_t s = 1; s < n; s *= 2) {
    Shape limit = x.shape(), low = zeros;
    limit[dim] = n - s;
    low[dim] = s;
    Value shifted = b.pad(b.slice(acc, start, limit), pad_value, low, zeros);
    acc = combine(b, shifted, acc);
  }
  return acc;
}

Value prefix_sum(Builder& b, const Value& x, int64_t dim) {
  return inclusive_scan(b, x, dim, 0.0, [](Builder& b, const Value& u, const Value& v) { return b.binary("add", u, v); });
}

namespace {

// Converts self to the result dtype (dtype= or int -> int64 from Meta), scans
// in the accumulation dtype and rounds once.
std::vector<Value> cumulative(LoweringContext& ctx, double identity, const Combine& combine) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = math_dtype(out);
  Value x = b.convert(b.convert(ctx.tensor("self"), out), acc);
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  if (x.rank() == 0) x = b.reshape(x, {1});
  if (x.type.numel() == 0) return {b.zeros(ctx.out())};
  return {b.reshape(b.convert(inclusive_scan(b, x, dim, identity, combine), out), ctx.out().shape)};
}

Combine binary_op(const char* name) {
  return [name](Builder& b, const Value& a, const Value& c) { return b.binary(name, a, c); };
}

// log(exp(a) + exp(b)) = max + log1p(exp(-|a - b|)). Equal operands (this
// covers a == b == +-inf, where a - b is nan) give max + log(2); a nan
// operand propagates.
Value logaddexp(Builder& b, const Value& a, const Value& c) {
  Value m = b.binary("maximum", a, c);
  Value d = b.unary("negate", b.unary("abs", b.binary("subtract", a, c)));
  d = b.select(b.compare(Cmp::EQ, a, c), splat_like(b, 0.0, d), d);
  Value r = b.binary("add", m, b.unary("log_plus_one", b.unary("exponential", d)));
  // maximum may drop a nan on some backends; PyTorch propagates it.
  Value nan = b.binary("or", b.compare(Cmp::NE, a, a), b.compare(Cmp::NE, c, c));
  return b.select(nan, b.binary("add", a, c), r);
}

// cummax/cummin: (running extreme, its index), the same log-step scan over
// (value, index) pairs. The later element wins on ties and NaN beats every
// number, a later NaN the earlier one, as CPU's loop (x >= best or isnan(x)).
// That choice is associative, so the scan's grouping does not change it.
std::vector<Value> cumulative_extreme(LoweringContext& ctx, bool is_max) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  if (x.rank() == 0) x = b.reshape(x, {1});
  if (x.type.numel() == 0) return {b.zeros(ctx.out(0)), b.zeros(ctx.out(1))};
  int64_t n = x.shape()[dim];
  Value pos = b.iota({DType::I64, x.shape()}, dim), idx = pos;
  bool nan = is_float(x.dtype());
  Value v = x;
  Shape zeros(x.rank(), 0), start(x.rank(), 0);
  for (int64_t s = 1; s < n; s *= 2) {
    Shape limit = x.shape(), low = zeros;
    limit[dim] = n - s;
    low[dim] = s;
    // Positions with nothing s before them keep their own pair.
    Value has_earlier = b.compare(Cmp::GE, pos, b.splat(Scalar::from_int(s), pos.type));
    Value ev = b.pad(b.slice(v, start, limit), v.dtype() == DType::Bool ? b.constant(Scalar::from_bool(false), DType::Bool)
                                                                     : b.constant(0.0, v.dtype()), low, zeros);
    Value ei = b.pad(b.slice(idx, start, limit), b.constant_int(0, DType::I64), low, zeros);
    Value later_wins = x.dtype() == DType::Bool
        ? (is_max ? b.binary("or", v, b.unary("not", ev)) : b.binary("or", b.unary("not", v), ev))
        : b.compare(is_max ? Cmp::GE : Cmp::LE, v, ev);
    if (nan) {
      Value later_nan = b.compare(Cmp::NE, v, v), earlier_nan = b.compare(Cmp::NE, ev, ev);
      later_wins = b.binary("or", later_nan, b.binary("and", b.unary("not", earlier_nan), later_wins));
    }
    Value keep = b.binary("or", b.unary("not", has_earlier), later_wins);
    v = b.select(keep, v, ev);
    idx = b.select(keep, idx, ei);
  }
  return {b.reshape(v, ctx.out(0).shape), b.reshape(idx, ctx.out(1).shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("cummax", [](LoweringContext& c) { return cumulative_extreme(c, true); });
TORCH_PJRT_LOWERING("cummin", [](LoweringContext& c) { return cumulative_extreme(c, false); });
TORCH_PJRT_LOWERING("cumsum", [](LoweringContext& c) { return cumulative(c, 0.0, binary_op("add")); });
TORCH_PJRT_LOWERING("cumprod", [](LoweringContext& c) { return cumulative(c, 1.0, binary_op("multiply")); });
// logcumsumexp is CompositeExplicitAutograd over _logcumsumexp, which has no
// Meta kernel (so the executor cannot run it): the lowering is registered
// under the public name, which has one.
TORCH_PJRT_LOWERING("logcumsumexp", [](LoweringContext& c) {
  return cumulative(c, -std::numeric_limits<double>::infinity(), logaddexp);
});

}  // namespace torch_pjrt::lowering::ops
