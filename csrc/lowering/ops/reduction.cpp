// Reductions: sum, mean, prod, nansum, amax/amin, aminmax, count_nonzero,
// max/min, argmax/argmin, var/std,
// all/any, linalg_vector_norm and norm, cdist. The Meta kernel already fixed the result shape
// (keepdim or not), so each lowering reduces and then reshapes to ctx.out().
#include <algorithm>
#include <cmath>
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// PyTorch's CPU kernels accumulate float16/bfloat16 in float32.
DType acc_dtype(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

// The identity of max (lowest value) or min (highest value) for `dt`.
Value extreme(Builder& b, DType dt, bool lowest) {
  double inf = std::numeric_limits<double>::infinity();
  switch (dt) {
    case DType::Bool: return b.constant(Scalar::from_bool(!lowest), dt);
    case DType::U8: return b.constant_int(lowest ? 0 : 255, dt);
    case DType::I8: return b.constant_int(lowest ? INT8_MIN : INT8_MAX, dt);
    case DType::I16: return b.constant_int(lowest ? INT16_MIN : INT16_MAX, dt);
    case DType::I32: return b.constant_int(lowest ? INT32_MIN : INT32_MAX, dt);
    case DType::I64: return b.constant_int(lowest ? INT64_MIN : INT64_MAX, dt);
    default: return b.constant(lowest ? -inf : inf, dt);
  }
}

// The reduced dims of `self` from the optional "dim" argument: None is all;
// [] is all too, except where the output keeps self's shape (all/any).
std::vector<int64_t> reduced_dims(const LoweringContext& ctx, const Value& x) {
  std::vector<int64_t> dims = ctx.ints("dim");
  // dim=(): all/any reduce nothing, sum and mean everything; the output's
  // shape says which.
  if (dims.empty() && ctx.has("dim") && x.rank() > 0 && ctx.out().shape == x.shape()) return {};
  return wrap_dims(dims, x.rank());
}

int64_t count(const Value& x, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= x.shape()[d];
  return n;
}

// Broadcasts a reduction over `dims` back to the shape of `x`.
Value unreduce(Builder& b, const Value& r, const Value& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) kept.push_back(i);
  return b.broadcast_in_dim(r, x.shape(), kept);
}

Value max_or_min(Builder& b, const Value& x, const std::vector<int64_t>& dims, bool is_max) {
  // Bool max/min are or/and.
  std::string body = x.dtype() == DType::Bool ? (is_max ? "stablehlo.or" : "stablehlo.and")
                                              : (is_max ? "stablehlo.maximum" : "stablehlo.minimum");
  Value r = b.reduce(x, extreme(b, x.dtype(), is_max), dims, body);
  if (!is_float(x.dtype())) return r;
  // XLA's CPU reduce drops NaN; PyTorch propagates it.
  Value nan = b.reduce(b.compare(Cmp::NE, x, x), b.constant(Scalar::from_bool(false), DType::Bool),
                       dims, "stablehlo.or");
  return b.select(nan, splat_like(b, std::numeric_limits<double>::quiet_NaN(), r), r);
}

// Sum-like reductions: input converted to the result dtype (dtype= or Meta's
// promotion, e.g. int -> int64), accumulated in acc_dtype; `skip_nan`
// (nansum) takes NaN as 0.
std::vector<Value> sum_like(LoweringContext& ctx, const char* body, double init, bool mean, bool skip_nan = false) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  DType out = ctx.out().dtype, acc = acc_dtype(out);
  Value x = b.convert(b.convert(self, out), acc);
  if (skip_nan && is_float(acc)) x = b.select(b.compare(Cmp::NE, x, x), splat_like(b, 0, x), x);
  auto dims = reduced_dims(ctx, x);
  Value r = b.reduce(x, b.constant(init, acc), dims, body);
  if (mean) r = b.binary("divide", r, splat_like(b, double(count(x, dims)), r));
  return {b.reshape(r, ctx.out().shape)};
}

std::vector<Value> amax_amin(LoweringContext& ctx, bool is_max) {
  const Value& x = ctx.tensor("self");
  return {ctx.b.reshape(max_or_min(ctx.b, x, reduced_dims(ctx, x), is_max), ctx.out().shape)};
}

// aminmax(self, dim=None, keepdim): (amin, amax) over one dim or all (the
// Meta kernel rejects an empty one).
std::vector<Value> aminmax(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  std::vector<int64_t> dims;
  if (ctx.has("dim")) {
    int64_t d = wrap_dim(ctx.to_int("dim", 0), x.rank());
    if (x.rank() == 0) x = b.reshape(x, {1});
    dims = {d};
  } else {
    for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(i);
  }
  return {b.reshape(max_or_min(b, x, dims, false), ctx.out(0).shape),
          b.reshape(max_or_min(b, x, dims, true), ctx.out(1).shape)};
}

// count_nonzero(self, dim): how many are non-zero, as int64.
std::vector<Value> count_nonzero(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  Value nz = b.convert(b.compare(Cmp::NE, x, b.zeros(x.type)), DType::I64);
  Value r = b.reduce(nz, b.constant_int(0, DType::I64), reduced_dims(ctx, x), "stablehlo.add");
  return {b.reshape(r, ctx.out().shape)};
}

// Max/min along one dim with the index of its first occurrence (NaN counts as
// the extreme, as on CPU): the extreme first, then the lowest index holding it.
std::pair<Value, Value> arg_reduce(Builder& b, Value x, int64_t dim, bool is_max) {
  if (x.rank() == 0) x = b.reshape(x, {1});
  Value m = max_or_min(b, x, {dim}, is_max);
  Value hit = b.compare(Cmp::EQ, x, unreduce(b, m, x, {dim}));
  if (is_float(x.dtype())) hit = b.binary("or", hit, b.compare(Cmp::NE, x, x));
  TensorType it{DType::I64, x.shape()};
  int64_t n = x.shape()[dim];
  Value idx = b.select(hit, b.iota(it, dim), b.splat(Scalar::from_int(n), it));
  Value i = b.reduce(idx, b.constant_int(n, DType::I64), {dim}, "stablehlo.minimum");
  return {m, i};
}

// CPU's IndexError for max/min/argmax/argmin along an empty dim (their Meta
// functions accept it, so compiled graphs reached the lowering with it).
void check_reduced_dim_not_empty(LoweringContext& ctx, const Value& x, int64_t dim) {
  if (x.rank() > 0 && x.shape()[dim] == 0)
    ctx.index_error(ctx.op + "(): Expected reduction dim " + std::to_string(dim) + " to have non-zero size.");
}

std::vector<Value> max_min(LoweringContext& ctx, bool is_max) {
  Builder& b = ctx.b;
  if (ctx.has("other")) {  // elementwise max.other / min.other
    DType dt = compute_dtype(ctx, "self", "other");
    Value a = operand_as(ctx, "self", dt, ctx.out().shape), o = operand_as(ctx, "other", dt, ctx.out().shape);
    return {b.binary(is_max ? "maximum" : "minimum", a, o)};
  }
  const Value& x = ctx.tensor("self");
  if (!ctx.has("dim")) {
    // The Meta kernel accepts this; CPU raises (max has no identity).
    if (x.type.numel() == 0)
      ctx.fail(ctx.op + "(): Expected reduction dim to be specified for input.numel() == 0.");
    return {b.reshape(max_or_min(b, x, reduced_dims(ctx, x), is_max), ctx.out().shape)};
  }
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  check_reduced_dim_not_empty(ctx, x, dim);
  auto [v, i] = arg_reduce(b, x, dim, is_max);
  return {b.reshape(v, ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

std::vector<Value> argmax_argmin(LoweringContext& ctx, bool is_max) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  int64_t dim = 0;
  if (ctx.has("dim")) {
    dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
    check_reduced_dim_not_empty(ctx, x, dim);
  } else {
    if (x.type.numel() == 0)
      ctx.index_error(ctx.op + "(): Expected reduction dim to be specified for input.numel() == 0.");
    x = b.reshape(x, {x.type.numel()});  // dim=None: index into the flattened tensor
  }
  return {b.reshape(arg_reduce(b, x, dim, is_max).second, ctx.out().shape)};
}

// var/std (and var_mean/std_mean): two-pass, divided by max(N - correction, 0).
// The mean is taken of the values shifted by each reduced slice's first
// element, so a constant slice has a mean of exactly its value and a variance
// of exactly 0, as CPU's Welford gives (std's gradient there is then 0, not
// that of sqrt at 1e-15). Complex: CPU's, each part's variance summed and the
// mean made of the parts' means.
struct Moments {
  Value var, mean;  // var before any sqrt; mean as CPU's Welford gives it
};

Moments moments(Builder& b, const Value& x, const std::vector<int64_t>& dims, double n, double correction) {
  Value zero = b.constant(0.0, x.dtype());
  Value mean;
  if (n > 0) {
    Shape start(static_cast<size_t>(x.rank()), 0), limit = x.shape(), kept;
    for (auto d : dims) limit[d] = 1;
    for (int64_t i = 0; i < x.rank(); ++i)
      if (std::find(dims.begin(), dims.end(), i) == dims.end()) kept.push_back(x.shape()[i]);
    Value first = b.reshape(b.slice(x, start, limit), kept);
    // (A non-finite first element shifts by 0 instead: inf - inf would be nan.)
    Value zeros = splat_like(b, 0.0, first);
    first = b.select(b.compare(Cmp::EQ, b.binary("subtract", first, first), zeros), first, zeros);
    Value total = b.reduce(b.binary("subtract", x, unreduce(b, first, x, dims)), zero, dims, "stablehlo.add");
    mean = b.binary("add", first, b.binary("divide", total, splat_like(b, n, total)));
  } else {
    Value total = b.reduce(x, zero, dims, "stablehlo.add");
    mean = b.binary("divide", total, splat_like(b, n, total));
  }
  Value d = b.binary("subtract", x, unreduce(b, mean, x, dims));
  Value ss = b.reduce(b.binary("multiply", d, d), zero, dims, "stablehlo.add");
  // CPU's Welford mean is nan wherever the variance is (an inf among the
  // values, then another value), except over one value: that value itself.
  if (n != 1) mean = b.select(b.compare(Cmp::NE, ss, ss), ss, mean);
  return {b.binary("divide", ss, splat_like(b, std::max(n - correction, 0.0), ss)), mean};
}

std::vector<Value> var_std(LoweringContext& ctx, bool sqrt, bool with_mean) {
  Builder& b = ctx.b;
  // (an out= tensor may be complex, as CPU allows: the real result is written into it)
  DType acc = acc_dtype(real_dtype(ctx.out().dtype));
  const Value& self = ctx.tensor("self");
  bool complex = is_complex(self.dtype());
  auto dims = reduced_dims(ctx, self);
  double n = double(count(self, dims));
  double correction = ctx.has("correction") ? ctx.to_double("correction", 1)
                                            : (ctx.to_bool("unbiased", true) ? 1 : 0);
  if (n - correction <= 0)  // CPU's warning (ReduceOps.cpp), e.g. "std_mean(): ..."
    ctx.warn(ctx.op + "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
             "factor (input numel divided by output numel).");
  Value r, mean;
  if (complex) {
    Moments re = moments(b, b.convert(real_part(b, self), acc), dims, n, correction);
    Moments im = moments(b, b.convert(imag_part(b, self), acc), dims, n, correction);
    r = b.binary("add", re.var, im.var);
    mean = make_complex(b, re.mean, im.mean);
  } else {
    Moments m = moments(b, b.convert(self, acc), dims, n, correction);
    r = m.var;
    mean = m.mean;
  }
  if (sqrt) r = b.unary("sqrt", r);
  std::vector<Value> res{b.convert(b.reshape(r, ctx.out(0).shape), ctx.out(0).dtype)};
  if (with_mean) res.push_back(b.convert(b.reshape(mean, ctx.out(1).shape), ctx.out(1).dtype));
  return res;
}

std::vector<Value> all_any(LoweringContext& ctx, bool all) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  // (complex: non-zero in either part; a convert would keep the real part)
  x = is_complex(x.dtype()) ? b.compare(Cmp::NE, x, b.zeros(x.type)) : b.convert(x, DType::Bool);
  Value r = b.reduce(x, b.constant(Scalar::from_bool(all), DType::Bool), reduced_dims(ctx, x),
                     all ? "stablehlo.and" : "stablehlo.or");
  return {b.reshape(r, ctx.out().shape)};
}

// (sum of a^p over dims)^(1/p) of absolute values `a`, for a finite order p
// (0: how many are non-zero), as vector_norm and cdist take it.
Value finite_p_norm(Builder& b, const Value& a, const std::vector<int64_t>& dims, double p, DType acc) {
  auto sum = [&](const Value& v) { return b.reduce(v, b.constant(0.0, acc), dims, "stablehlo.add"); };
  if (p == 0) return sum(b.convert(b.compare(Cmp::NE, a, splat_like(b, 0, a)), acc));
  if (p == 1) return sum(a);
  if (p == 2) return b.unary("sqrt", sum(b.binary("multiply", a, a)));
  Value r = sum(b.binary("power", a, splat_like(b, p, a)));
  return b.binary("power", r, splat_like(b, 1.0 / p, r));
}

std::vector<Value> vector_norm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType in = ctx.tensor("self").dtype();
  if (!is_float(in) && !is_complex(in))  // (CPU's check; large _foreach_norm lists are not probed)
    ctx.fail(std::string("linalg.vector_norm: Expected a floating point or complex tensor as input. Got ") +
             scalar_type_name(in));
  DType acc = acc_dtype(ctx.out().dtype);
  const Value& self = ctx.tensor("self");
  // (complex: |z| in the real dtype, then the real norm, as CPU)
  Value a = is_complex(in) ? b.convert(complex_abs(b, self), acc) : b.unary("abs", b.convert(self, acc));
  auto dims = reduced_dims(ctx, a);
  double p = ctx.to_double("ord", 2.0);
  Value r = std::isinf(p) ? max_or_min(b, a, dims, p > 0) : finite_p_norm(b, a, dims, p, acc);
  return {b.reshape(r, ctx.out().shape)};
}

// renorm(self, p, dim, maxnorm): each slice along dim whose p-norm exceeds
// maxnorm is scaled by maxnorm / (norm + 1e-7), as CPU: the norm over the
// other dims in float32 for half types, rounded to self's dtype, the factor
// in float64 from it, rounded, and the product in self's dtype. (Its Meta
// function checks p, maxnorm and the rank.)
std::vector<Value> renorm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  DType t = self.dtype(), acc = acc_dtype(t);
  if (self.type.numel() == 0) return {b.zeros(ctx.out())};
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), self.rank());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (d != dim) dims.push_back(d);
  double p = ctx.to_double("p", 2.0), maxnorm = ctx.to_double("maxnorm", 1.0);
  // (complex: the norm of |z| in the part type; the factor scales both parts)
  DType rt = real_dtype(t), racc = real_dtype(acc);
  Value a = is_complex(t) ? complex_abs(b, self) : b.unary("abs", b.convert(self, acc));
  Value norm = b.convert(std::isinf(p) ? max_or_min(b, a, dims, p > 0) : finite_p_norm(b, a, dims, p, racc), rt);
  auto f64 = [&](const Value& v) { return b.convert(v, DType::F64); };
  Value eps = b.convert(b.convert(b.splat(Scalar::from_float(1e-7), {DType::F64, norm.shape()}), rt), racc);
  Value shifted = f64(b.convert(b.binary("add", b.convert(norm, racc), eps), rt));  // norm + eps in self's dtype
  Value factor = b.convert(b.binary("divide", splat_like(b, maxnorm, shifted), shifted), rt);
  factor = b.select(b.compare(Cmp::GT, f64(norm), splat_like(b, maxnorm, f64(norm))), factor, splat_like(b, 1, factor));
  Value scaled = b.binary("multiply", b.convert(self, acc), b.broadcast_in_dim(b.convert(factor, acc), self.shape(), {dim}));
  return {b.convert(scaled, ctx.out().dtype)};
}

// aten::norm takes the order as "p"; _foreach_norm's element passes "ord".
std::vector<Value> norm(LoweringContext& ctx) {
  if (ctx.has("p") && !ctx.has("ord")) {
    Arg ord = ctx.arg("p");
    ord.name = "ord";
    ctx.args.push_back(ord);
  }
  return vector_norm(ctx);
}

// _cdist_forward(x1 [..., P, M], x2 [..., R, M], p, compute_mode) -> [..., P, R]:
// the p-norm of every row difference, computed directly (also where CPU
// uses the matmul form for p = 2, which rounds differently). The differences
// are [..., P, R, M] (batch dims broadcast as the result's).
struct Cdist {
  Value diff;  // x1 - x2, [..., P, R, M] in the accumulation dtype
  int64_t last;  // the M dim
  DType acc;     // the result's accumulation dtype
};

// The differences of a _cdist_* call's x1 and x2 (batch dims: its result's).
Cdist cdist_diff(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType acc = acc_dtype(out.dtype);
  Shape batch(out.shape.begin(), out.shape.end() - 2);
  const Value& x1 = ctx.tensor("x1");
  const Value& x2 = ctx.tensor("x2");
  int64_t nb = static_cast<int64_t>(batch.size());
  int64_t P = x1.shape()[x1.rank() - 2], R = x2.shape()[x2.rank() - 2], M = x1.shape().back();
  auto spread = [&](const Value& x, int64_t rows, int64_t at) {
    Shape s = batch, full = batch;
    s.insert(s.end(), {rows, M});
    full.insert(full.end(), {P, R, M});
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < nb; ++d) dims.push_back(d);
    dims.insert(dims.end(), {nb + at, nb + 2});
    return b.broadcast_in_dim(b.broadcast_to(b.convert(x, acc), s), full, dims);
  };
  return {b.binary("subtract", spread(x1, P, 0), spread(x2, R, 1)), nb + 2, acc};
}

std::vector<Value> cdist_forward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Cdist c = cdist_diff(ctx);
  DType acc = c.acc;
  double p = ctx.to_double("p", 2.0);
  Value a = b.unary("abs", c.diff);
  Value r = std::isinf(p) ? b.reduce(a, b.constant(0.0, acc), {c.last}, "stablehlo.maximum")
                          : finite_p_norm(b, a, {c.last}, p, acc);
  return {b.convert(r, out.dtype)};
}

// _cdist_backward(grad, x1, x2, p, cdist) -> grad of x1 ([..., P, M], batch
// dims broadcast): sum over R of grad * d dist / d x1, as CPU's kernels:
// 0 where the distance is 0 (p < 1 also where the difference is).
std::vector<Value> cdist_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  // Empty rows, columns, features or batch: zeros of x1's shape, as CPU's
  // kernel (x2's batch dims need not be x1's then: an empty batch of one).
  if (ctx.tensor("grad").type.numel() == 0 || ctx.tensor("x1").type.numel() == 0 ||
      ctx.tensor("x2").type.numel() == 0)
    return {b.zeros(out)};
  Cdist c = cdist_diff(ctx);
  DType acc = c.acc;
  const Shape& full = c.diff.shape();
  std::vector<int64_t> pr;
  for (int64_t d = 0; d < c.last; ++d) pr.push_back(d);
  auto spread = [&](const char* name) {
    return b.broadcast_in_dim(b.convert(ctx.tensor(name), acc), full, pr);
  };
  Value grad = spread("grad"), dist = spread("cdist");
  double p = ctx.to_double("p", 2.0);
  Value diff = c.diff, a = b.unary("abs", diff), zero = splat_like(b, 0, diff);
  Value sign = b.unary("sign", diff);
  Value dist_zero = b.compare(Cmp::EQ, dist, zero), f;
  if (p == 0) {
    f = zero;
  } else if (p == 1) {
    f = sign;
  } else if (std::isinf(p)) {
    f = b.binary("multiply", sign, b.convert(b.compare(Cmp::EQ, a, dist), acc));
  } else if (p == 2) {
    f = b.binary("divide", diff, dist);
  } else if (p < 2) {
    Value pm1 = splat_like(b, p - 1, diff);
    f = b.binary("divide", b.binary("multiply", sign, b.binary("power", a, pm1)), b.binary("power", dist, pm1));
    if (p < 1) dist_zero = b.binary("or", dist_zero, b.compare(Cmp::EQ, diff, zero));
  } else {
    f = b.binary("divide", b.binary("multiply", diff, b.binary("power", a, splat_like(b, p - 2, diff))),
                 b.binary("power", dist, splat_like(b, p - 1, diff)));
  }
  if (p != 0 && p != 1) f = b.select(dist_zero, zero, f);
  Value r = b.reduce(b.binary("multiply", f, grad), b.constant(0.0, acc), {c.last - 1}, "stablehlo.add");
  return {b.convert(r, out.dtype)};
}

}  // namespace

// trace(self): the sum of a matrix's main diagonal, in the result dtype
// (integers -> int64) accumulated as sum is.
static std::vector<Value> trace(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = acc_dtype(out);
  Value x = b.convert(b.convert(ctx.tensor("self"), out), acc);
  if (x.rank() != 2) ctx.fail("trace: expected a matrix, but got tensor with dim " + std::to_string(x.rank()));
  if (ctx.tensor("self").dtype() == DType::Bool) ctx.not_implemented("\"trace\" not implemented for 'Bool'");
  TensorType idx{DType::I64, x.shape()};
  Value diag = b.compare(Cmp::EQ, b.iota(idx, 0), b.iota(idx, 1));
  Value r = b.reduce(b.select(diag, x, splat_like(b, 0, x)), b.constant(0.0, acc), {0, 1}, "stablehlo.add");
  return {b.reshape(b.convert(r, out), ctx.out().shape)};
}

TORCH_PJRT_LOWERING("trace", trace);
TORCH_PJRT_LOWERING("sum", [](LoweringContext& c) { return sum_like(c, "stablehlo.add", 0, false); });
TORCH_PJRT_LOWERING("mean", [](LoweringContext& c) { return sum_like(c, "stablehlo.add", 0, true); });
TORCH_PJRT_LOWERING("prod", [](LoweringContext& c) { return sum_like(c, "stablehlo.multiply", 1, false); });
TORCH_PJRT_LOWERING("nansum", [](LoweringContext& c) { return sum_like(c, "stablehlo.add", 0, false, true); });
TORCH_PJRT_LOWERING("aminmax", aminmax);
TORCH_PJRT_LOWERING("count_nonzero", count_nonzero);
TORCH_PJRT_LOWERING("amax", [](LoweringContext& c) { return amax_amin(c, true); });
TORCH_PJRT_LOWERING("amin", [](LoweringContext& c) { return amax_amin(c, false); });
TORCH_PJRT_LOWERING("max", [](LoweringContext& c) { return max_min(c, true); });
TORCH_PJRT_LOWERING("min", [](LoweringContext& c) { return max_min(c, false); });
TORCH_PJRT_LOWERING("argmax", [](LoweringContext& c) { return argmax_argmin(c, true); });
TORCH_PJRT_LOWERING("argmin", [](LoweringContext& c) { return argmax_argmin(c, false); });
TORCH_PJRT_LOWERING("var", [](LoweringContext& c) { return var_std(c, false, false); });
TORCH_PJRT_LOWERING("std", [](LoweringContext& c) { return var_std(c, true, false); });
TORCH_PJRT_LOWERING("var_mean", [](LoweringContext& c) { return var_std(c, false, true); });
TORCH_PJRT_LOWERING("std_mean", [](LoweringContext& c) { return var_std(c, true, true); });
TORCH_PJRT_LOWERING("all", [](LoweringContext& c) { return all_any(c, true); });
TORCH_PJRT_LOWERING("any", [](LoweringContext& c) { return all_any(c, false); });
TORCH_PJRT_LOWERING("linalg_vector_norm", vector_norm);
TORCH_PJRT_LOWERING("norm", norm);
TORCH_PJRT_LOWERING("renorm", renorm);
TORCH_PJRT_LOWERING("_cdist_forward", cdist_forward);
TORCH_PJRT_LOWERING("_cdist_backward", cdist_backward);

}  // namespace torch_pjrt::lowering::ops
