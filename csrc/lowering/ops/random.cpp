// Random ops: counter-based Threefry bits keyed by the 128-bit state the
// executor draws from the tpu generator for each call, so programs are
// compiled once and results follow torch.manual_seed.
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "lowering/ops/common.h"
#include "lowering/ops/random_bits.h"

namespace torch_pjrt::lowering::ops {
namespace {

// `n` random words of `dt` (I32 or I64) as a flat tensor.
Value random_bits(LoweringContext& ctx, int64_t n, DType dt) {
  Builder& b = ctx.b;
  if (!ctx.rng_state) ctx.fail("random lowering without a random state");
  int64_t words = dt == DType::I64 ? 2 * n : n;
  Value bits = random_words(b, *ctx.rng_state, words);
  if (dt == DType::I32) return bits;
  // Two 32-bit words per value, zero-extended and joined.
  Value mask = b.splat(Scalar::from_int(0xFFFFFFFFLL), TensorType{DType::I64, {n}});
  Value lo = b.binary("and", b.convert(b.slice(bits, {0}, {n}), DType::I64), mask);
  Value hi = b.convert(b.slice(bits, {n}, {2 * n}), DType::I64);
  hi = b.op("stablehlo.shift_left", {hi, b.splat(Scalar::from_int(32), hi.type)}, hi.type);
  return b.binary("or", hi, lo);
}

// Mantissa digits of a float dtype (std::numeric_limits<T>::digits).
int digits(DType t) {
  switch (t) {
    case DType::F16: return 11;
    case DType::BF16: return 8;
    case DType::F64: return 53;
    default: return 24;
  }
}

// The type random floats are computed in: float, or double for double outputs.
DType work_type(DType out) { return out == DType::F64 ? DType::F64 : DType::F32; }

// Uniform floats in [0, 1) with `digits(out)` random bits each, as PyTorch
// draws them: (bits >> (W - digits)) * 2^-digits, exact in every float type.
// `count` values of type work_type(out).
Value uniform01(LoweringContext& ctx, int64_t count, DType out) {
  Builder& b = ctx.b;
  DType wt = work_type(out);
  DType it = wt == DType::F64 ? DType::I64 : DType::I32;
  int width = wt == DType::F64 ? 64 : 32, d = digits(out);
  Value bits = random_bits(ctx, count, it);
  bits = b.op("stablehlo.shift_right_logical", {bits, b.splat(Scalar::from_int(width - d), bits.type)},
              bits.type);
  Value f = b.convert(bits, wt);
  return b.binary("multiply", f, b.splat(Scalar::from_float(std::ldexp(1.0, -d)), f.type));
}

// The values of dtype t, as doubles (CPU's bounds of random ops' arguments).
std::pair<double, double> bounds(DType t) {
  if (is_float(t)) return {-largest_finite(t), largest_finite(t)};
  if (t == DType::Bool) return {0.0, 1.0};
  return integer_range(t);
}

// CPU's CHECK_OUT_OF_BOUNDS (DistributionTemplates.h), before its kernel.
void check_bound(LoweringContext& ctx, double v, const char* name, DType t) {
  auto [lo, hi] = bounds(t);
  if (!(v >= lo && v <= hi)) ctx.fail(std::string(name) + " is out of bounds for " + dtype_name(t));
}

// A number as CPU's messages print it (an ostream: "3", "0.5"), not
// std::to_string's "3.000000".
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::vector<Value> uniform(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  // PyTorch checks these in the device kernel, after its Meta kernel.
  if (!is_float(out.dtype))
    ctx.kernel_not_implemented("check_uniform_bounds", out.dtype);
  double from = ctx.to_double("from", 0.0), to = ctx.to_double("to", 1.0);
  check_bound(ctx, from, "from", out.dtype);
  check_bound(ctx, to, "to", out.dtype);
  if (!(from <= to))
    ctx.fail("uniform_ expects to return a [from, to) range, but found from=" + num(from) +
             " > to=" + num(to));
  if (!(to - from <= bounds(out.dtype).second))
    ctx.fail(std::string("uniform_ expects to-from <= std::numeric_limits<") + dtype_name(out.dtype) +
             ">::max(), but found to=" + num(to) + " and from=" + num(from) +
             " which result in to-from to exceed the limit");
  if (out.numel() == 0) return {b.zeros(out)};
  Value u = b.reshape(uniform01(ctx, out.numel(), out.dtype), out.shape);
  Value r = b.binary("add", b.binary("multiply", u, b.splat(Scalar::from_float(to - from), u.type)),
                     b.splat(Scalar::from_float(from), u.type));
  r = b.convert(r, out.dtype);
  // Rounding to a narrow output type may reach `to`; keep the interval half-open.
  Value top = b.splat(Scalar::from_float(to), r.type);
  return {b.select(b.compare(Cmp::GE, r, top), b.splat(Scalar::from_float(from), r.type), r)};
}

// CPU's error for a continuous distribution drawn into a non-float tensor.
void require_float(LoweringContext& ctx, const char* distribution) {
  if (!is_float(ctx.out().dtype))
    ctx.fail(std::string(distribution) + " distribution is a continuous probability distribution. dtype must be a "
             "floating point but you specified " + dtype_name(ctx.out().dtype));
}

// x * scale + shift (a draw moved to its distribution's location and scale).
Value affine(Builder& b, const Value& x, double scale, double shift) {
  return b.binary("add", b.binary("multiply", x, splat_like(b, scale, x)), splat_like(b, shift, x));
}

// exponential_(self, lambd): -log(u) / lambd for u uniform in (0, 1], as
// CUDA's kernel: a u of 1 takes -eps/2 for its log, so no sample is 0 (the
// Gumbel noise of gumbel_softmax, -log of these, stays finite).
std::vector<Value> exponential(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  require_float(ctx, "Exponential");
  double lambd = ctx.to_double("lambd", 1.0);
  if (!(lambd > 0)) ctx.fail("exponential_ expects lambda > 0.0, but found lambda=" + num(lambd));
  if (out.numel() == 0) return {b.zeros(out)};
  // Work-type precision for half outputs too: 8 bits would cut bfloat16's tail at 5.5.
  DType wt = work_type(out.dtype);
  Value u = b.reshape(uniform01(ctx, out.numel(), wt), out.shape);
  u = b.binary("subtract", splat_like(b, 1.0, u), u);  // (0, 1]
  double half_eps = std::ldexp(1.0, -digits(wt));
  Value log = b.select(b.compare(Cmp::GE, u, splat_like(b, 1.0 - half_eps, u)), splat_like(b, -half_eps, u),
                       b.unary("log", u));
  return {b.convert(b.binary("multiply", log, splat_like(b, -1.0 / lambd, log)), out.dtype)};
}

// cauchy_(self, median, sigma): median + sigma * tan(pi * (u - 1/2)), u
// uniform in [0, 1), as CPU's transformation.
std::vector<Value> cauchy(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  require_float(ctx, "Cauchy");
  double median = ctx.to_double("median", 0.0), sigma = ctx.to_double("sigma", 1.0);
  if (!(sigma > 0)) ctx.fail("cauchy_ expects sigma > 0.0, but found sigma=" + num(sigma));
  if (out.numel() == 0) return {b.zeros(out)};
  Value u = b.reshape(uniform01(ctx, out.numel(), out.dtype), out.shape);
  Value angle = b.binary("multiply", b.binary("subtract", u, splat_like(b, 0.5, u)), splat_like(b, M_PI, u));
  Value tan = b.binary("divide", b.unary("sine", angle), b.unary("cosine", angle));
  return {b.convert(affine(b, tan, sigma, median), out.dtype)};
}

// geometric_(self, p): the number of Bernoulli(p) trials to the first
// success, ceil(log(u) / log1p(-p)) for u uniform in (0, 1]; any dtype.
std::vector<Value> geometric(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  double p = ctx.to_double("p", 0.5);
  if (!(p > 0 && p < 1)) ctx.fail("geometric_ expects p to be in (0, 1), but got p=" + num(p));
  if (out.numel() == 0) return {b.zeros(out)};
  DType wt = is_float(out.dtype) ? out.dtype : DType::F32;
  Value u = b.reshape(uniform01(ctx, out.numel(), wt), out.shape);
  u = b.binary("subtract", splat_like(b, 1.0, u), u);  // (0, 1]
  Value r = b.unary("ceil", b.binary("divide", b.unary("log", u), splat_like(b, std::log1p(-p), u)));
  return {b.convert(r, out.dtype)};
}

// Standard normal values by Box-Muller over two uniform draws.
Value standard_normal(LoweringContext& ctx, const TensorType& out) {
  Builder& b = ctx.b;
  int64_t n = out.numel();
  // Full work-type precision even for half outputs: with bfloat16's 8 bits the
  // radius would stop at sqrt(-2 ln 2^-8) = 3.3.
  Value u = uniform01(ctx, 2 * n, work_type(out.dtype));
  Value u1 = b.slice(u, {0}, {n}), u2 = b.slice(u, {n}, {2 * n});
  u1 = b.binary("subtract", b.splat(Scalar::from_float(1.0), u1.type), u1);  // (0, 1]: log is finite
  Value radius = b.unary("sqrt", b.binary("multiply", b.splat(Scalar::from_float(-2.0), u1.type),
                                           b.unary("log", u1)));
  Value angle = b.binary("multiply", b.splat(Scalar::from_float(2 * M_PI), u2.type), u2);
  Value z = b.binary("multiply", radius, b.unary("cosine", angle));
  return b.reshape(z, out.shape);
}

// log_normal_(self, mean, std): exp(mean + std * z), z standard normal.
std::vector<Value> log_normal(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  require_float(ctx, "LogNormal");
  double mean = ctx.to_double("mean", 1.0), stdv = ctx.to_double("std", 2.0);
  if (!(stdv > 0)) ctx.fail("log_normal_ expects std > 0.0, but found std=" + num(stdv));
  if (out.numel() == 0) return {b.zeros(out)};
  Value z = standard_normal(ctx, out);
  return {b.convert(b.unary("exponential", affine(b, z, stdv, mean)), out.dtype)};
}

// A complex normal_ (float mean and std: the executor sends tensor ones to
// the CPU): as CPU, the real and imaginary parts each drawn with half the
// variance (std / sqrt(2)), the mean added to both.
Value complex_normal(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  TensorType pt{real_dtype(out.dtype), out.shape};
  int64_t n = out.numel();
  Value z = standard_normal(ctx, TensorType{pt.dtype, {2 * n}});
  Value stdv = b.binary("multiply", operand_as(ctx, "std", pt.dtype, out.shape),
                        b.splat(Scalar::from_float(M_SQRT1_2), pt));
  Value mean = operand_as(ctx, "mean", pt.dtype, out.shape);
  auto part = [&](int64_t k) {
    Value zk = b.reshape(b.slice(z, {k * n}, {(k + 1) * n}), out.shape);
    return b.binary("add", b.binary("multiply", zk, stdv), mean);
  };
  return b.op("stablehlo.complex", {part(0), part(1)}, out);
}

// normal_(self, mean, std) and normal(mean, std) with tensor or float mean/std.
std::vector<Value> normal(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  if (is_complex(out.dtype)) return {complex_normal(ctx)};
  Value z = standard_normal(ctx, out);
  Value mean = operand_as(ctx, "mean", z.dtype(), out.shape);
  Value stdv = operand_as(ctx, "std", z.dtype(), out.shape);
  if (ctx.arg("std").kind == Arg::Tensor)  // (a float std is checked before the kernel)
    ctx.check_all(b.compare(Cmp::GE, stdv, splat_like(b, 0, stdv)), "normal expects all elements of std >= 0.0",
                  LoweringContext::CheckError::Runtime);
  return {b.binary("add", b.binary("multiply", z, stdv), mean)};
}

// bernoulli_(self, p) with p a float or tensor, and bernoulli(self) with self the probabilities.
std::vector<Value> bernoulli(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  DType wt = work_type(out.dtype);
  Value u = b.reshape(uniform01(ctx, out.numel(), wt), out.shape);
  Value p = operand_as(ctx, ctx.has("p") ? "p" : "self", wt, out.shape);
  // CPU rejects probabilities outside [0, 1] (NaN too); p may be a runtime input.
  ctx.check_all(b.binary("and", b.compare(Cmp::GE, p, splat_like(b, 0, p)), b.compare(Cmp::LE, p, splat_like(b, 1, p))),
                "bernoulli expects p to be in [0, 1]", LoweringContext::CheckError::Runtime);
  return {b.convert(b.compare(Cmp::LT, u, p), out.dtype)};
}

// Largest integer random_ draws by default: 2^digits for floats, the max of integers.
int64_t default_to_inclusive(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::U8: return 255;
    case DType::I8: return 127;
    case DType::I16: return 32767;
    case DType::I32: return std::numeric_limits<int32_t>::max();
    case DType::I64: return std::numeric_limits<int64_t>::max();
    default: return int64_t(1) << digits(t);
  }
}

// random_(self), random_(self, to), random_(self, from, to): integers in
// [from, to) (to inclusive of the default bound), drawn as 64-bit words mod range.
std::vector<Value> random(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  int64_t from = ctx.has("from") ? ctx.to_int("from", 0) : 0;
  // Range as unsigned: [from, to) has `range` values; 0 means 2^64.
  uint64_t range;
  if (ctx.has("to")) {
    int64_t to = ctx.to_int("to", 0);
    if (from >= to)
      ctx.fail("random_ expects 'from' to be less than 'to', but got from=" + std::to_string(from) +
               " >= to=" + std::to_string(to));
    if (out.dtype != DType::U64) {  // CPU's check_from_to_in_range
      check_bound(ctx, double(from), "from", out.dtype);
      check_bound(ctx, double(to - 1), "to - 1", out.dtype);
    }
    range = uint64_t(to) - uint64_t(from);
  } else {
    range = uint64_t(default_to_inclusive(out.dtype)) - uint64_t(from) + 1;
  }
  Value v = random_bits(ctx, out.numel(), DType::I64);
  auto k = [&](uint64_t c) { return b.splat(Scalar::from_int(int64_t(c)), v.type); };
  if (range != 0 && range <= (uint64_t(1) << 63)) {
    // Non-negative 63-bit words, so signed remainder is the unsigned one.
    v = b.op("stablehlo.shift_right_logical", {v, k(1)}, v.type);
    v = b.binary("remainder", v, k(range));
  } else if (range != 0) {
    // v mod range for range > 2^63 is v or v - range; the unsigned v < range
    // is a signed compare with both sign bits flipped.
    Value lt = b.compare(Cmp::LT, b.binary("xor", v, k(uint64_t(1) << 63)), k(range ^ (uint64_t(1) << 63)));
    v = b.select(lt, v, b.binary("subtract", v, k(range)));
  }
  v = b.binary("add", v, b.splat(Scalar::from_int(from), v.type));
  return {b.reshape(b.convert(v, out.dtype), out.shape)};
}

// multinomial(self, num_samples, replacement): indices drawn by an
// exponential race. Each category j gets a clock E_j = -log(u_j) / p_j; the
// smallest is j with probability p_j / sum(p), and the order of the clocks is
// sampling without replacement (sequentially proportional to what is left).
// With replacement each sample has clocks of its own (k * cats of them); from
// k > bit_width(cats) on, samples are drawn by inverting the rows' running sums
// instead (CPU's method): cats + k * log2(cats) work, not k * cats.
std::vector<Value> multinomial(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value self = ctx.tensor("self");
  if (!is_float(self.dtype()))  // (CPU's kernel checks this; the Meta kernel does not)
    ctx.fail(std::string("multinomial only supports floating-point dtypes for input, got: ") +
             scalar_type_name(self.dtype()));
  if (out.dtype != DType::I64)  // an out= of another dtype
    ctx.fail(std::string("multinomial expects Long tensor out, got: ") + scalar_type_name(out.dtype));
  int64_t rows = self.rank() == 2 ? self.shape()[0] : 1, cats = self.shape().back();
  int64_t k = ctx.to_int("num_samples", 1);
  bool replacement = ctx.to_bool("replacement", false);
  // CPU's checks of the arguments (the Meta kernel makes none of these).
  if (k <= 0) ctx.fail("cannot sample n_sample <= 0 samples");
  if (!replacement && k > cats) ctx.fail("cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  if (cats > (int64_t{1} << 24)) ctx.fail("number of categories cannot exceed 2^24");
  if (out.numel() == 0) return {b.zeros(out)};
  DType wt = work_type(self.dtype());
  Value p = b.reshape(b.convert(self, wt), {rows, cats});
  // CPU's checks, from the data.
  Value finite = b.compare(Cmp::EQ, b.binary("subtract", p, p), splat_like(b, 0, p));  // false for inf, NaN
  ctx.check_all(b.binary("and", finite, b.compare(Cmp::GE, p, splat_like(b, 0, p))),
                "probability tensor contains either `inf`, `nan` or element < 0", LoweringContext::CheckError::Runtime);
  Value sums = b.reduce(p, b.constant(0.0, wt), {1}, "stablehlo.add");
  ctx.check_all(b.compare(Cmp::GT, sums, splat_like(b, 0, sums)),
                "invalid multinomial distribution (sum of probabilities <= 0)", LoweringContext::CheckError::Runtime);
  auto clocks = [&](const Shape& shape, const Value& probs) {
    int64_t n = lowering::numel(shape);
    Value u = b.reshape(uniform01(ctx, n, wt), shape);
    // u in [0, 1): 1 - u in (0, 1], so the log is finite.
    Value e = b.unary("negate", b.unary("log", b.binary("subtract", splat_like(b, 1, u), u)));
    return b.binary("divide", e, probs);  // p = 0: +inf, never first
  };
  Value idx;
  if (!replacement) {
    // (CPU does not check that enough categories are positive: zero ones
    // come last here, in index order.)
    auto sorted = sort_with_indices(b, clocks({rows, cats}, p), 1, false);
    idx = b.slice(sorted.second, {0, 0}, {rows, k});
  } else if (k > std::bit_width(static_cast<uint64_t>(cats))) {
    // The first category whose running sum exceeds u * total. Zero categories
    // add nothing, so none is ever chosen; u * total rounding up to the total
    // (no category found) takes the last positive one.
    Value cdf = prefix_sum(b, p, 1);
    Value total = b.slice(cdf, {0, cats - 1}, {rows, cats});  // [rows, 1]
    Value u = b.reshape(uniform01(ctx, rows * k, wt), {rows, k});
    Value v = b.binary("multiply", u, b.broadcast_in_dim(b.reshape(total, {rows}), {rows, k}, {0}));
    idx = binary_search(b, cdf, v, nullptr, /*right=*/true);
    Value j = b.iota({DType::I64, {rows, cats}}, 1);
    Value last = b.reduce(b.select(b.compare(Cmp::GT, p, splat_like(b, 0, p)), j, b.zeros(j.type)),
                          b.constant_int(0, DType::I64), {1}, "stablehlo.maximum");
    Value none = b.compare(Cmp::GE, idx, b.splat(Scalar::from_int(cats), idx.type));
    idx = b.select(none, b.broadcast_in_dim(last, {rows, k}, {0}), idx);
  } else {
    Shape rkc{rows, k, cats};
    Value e = clocks(rkc, b.broadcast_in_dim(p, rkc, {0, 2}));
    Value first = b.reduce(e, b.constant(std::numeric_limits<double>::infinity(), wt), {2}, "stablehlo.minimum");
    Value at = b.compare(Cmp::EQ, e, b.broadcast_in_dim(first, rkc, {0, 1}));
    Value j = b.iota({DType::I64, rkc}, 2);
    idx = b.reduce(b.select(at, j, b.splat(Scalar::from_int(cats - 1), j.type)),
                   b.constant_int(cats - 1, DType::I64), {2}, "stablehlo.minimum");
  }
  return {b.reshape(idx, out.shape)};
}

// randperm(n): 0..n-1 ordered by 64-bit random keys (ties, which would keep
// index order, have probability about n^2 / 2^65).
std::vector<Value> randperm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  int64_t n = ctx.to_int("n", 0);
  if (is_complex(out.dtype) || out.dtype == DType::Bool) ctx.kernel_not_implemented("randperm", out.dtype);
  if (!is_float(out.dtype) && n > 0 && double(n - 1) > bounds(out.dtype).second)  // CPU converts n - 1
    ctx.fail(std::string("randperm: n = ") + std::to_string(n) + " is too large for dtype " +
             scalar_type_name(out.dtype) + " (value cannot be converted without overflow)");
  if (n == 0) return {b.zeros(out)};
  Value keys = random_bits(ctx, n, DType::I64);
  Value order = sort_with_indices(b, keys, 0, false).second;
  return {b.reshape(b.convert(order, out.dtype), out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("randperm", randperm, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("uniform", uniform, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("multinomial", multinomial, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("normal", normal, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("bernoulli", bernoulli, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("exponential", exponential, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("cauchy", cauchy, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("geometric", geometric, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("log_normal", log_normal, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("random", random, /*needs_rng=*/true);

}  // namespace torch_pjrt::lowering::ops
