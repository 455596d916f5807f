// Sorting and selection along one dim: sort, topk, kthvalue, median,
// nanmedian. All are built on one stable stablehlo.sort of (value, index)
// pairs whose comparator orders NaN above everything (PyTorch's order) and
// treats -0.0 == 0.0. Being stable, ties keep their original order, which is
// what stable=True promises and what CPU's sort does in practice. topk,
// kthvalue and median break ties by that order too; CPU's selection
// algorithms (nth_element) may pick another index among equal values.
#include <limits>
#include <stdexcept>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

const char* compare_type(DType t) {
  return is_float(t) ? "FLOAT" : (is_unsigned(t) || t == DType::Bool) ? "UNSIGNED" : "SIGNED";
}

// The comparator region: is (a, ia) ordered before (c, ic)? Only the values
// decide; stability keeps ties in index order.
std::string comparator(Builder& b, DType dt, bool descending) {
  std::string s = TensorType{dt, {}}.str(), i = TensorType{DType::I64, {}}.str(), p = "tensor<i1>";
  std::string a = b.fresh(), c = b.fresh(), ia = b.fresh(), ic = b.fresh();
  std::string text = "{\n    ^bb0(" + a + ": " + s + ", " + c + ": " + s + ", " + ia + ": " + i + ", " +
                     ic + ": " + i + "):\n";
  auto cmp = [&](const char* dir, const std::string& x, const std::string& y) {
    std::string r = b.fresh();
    text += "      " + r + " = \"stablehlo.compare\"(" + x + ", " + y +
            ") {comparison_direction = #stablehlo<comparison_direction " + dir +
            ">, compare_type = #stablehlo<comparison_type " + compare_type(dt) + ">} : (" + s + ", " +
            s + ") -> " + p + "\n";
    return r;
  };
  auto logic = [&](const char* op, const std::string& x, const std::string& y) {
    std::string r = b.fresh();
    text += "      " + r + " = \"stablehlo." + op + "\"(" + x + ", " + y + ") : (" + p + ", " + p +
            ") -> " + p + "\n";
    return r;
  };
  std::string r = cmp(descending ? "GT" : "LT", a, c);
  if (is_float(dt)) {
    // NaN is greatest: ascending puts (number, NaN) in order, descending (NaN, number).
    const std::string& nan_side = descending ? a : c;
    const std::string& num_side = descending ? c : a;
    r = logic("or", r, logic("and", cmp("NE", nan_side, nan_side), cmp("EQ", num_side, num_side)));
  }
  text += "      \"stablehlo.return\"(" + r + ") : (" + p + ") -> ()\n    }";
  return text;
}

}  // namespace

// (values, int64 indices) of x sorted along dim.
std::pair<Value, Value> sort_with_indices(Builder& b, const Value& x, int64_t dim, bool descending) {
  Value idx = b.iota({DType::I64, x.shape()}, dim);
  auto r = b.op_multi("stablehlo.sort", {x, idx}, {x.type, idx.type},
                      "dimension = " + std::to_string(dim) + " : i64, is_stable = true",
                      comparator(b, x.dtype(), descending));
  return {r[0], r[1]};
}

namespace {

Value take(Builder& b, const Value& x, int64_t dim, int64_t from, int64_t to) {
  Shape start(x.rank(), 0), limit = x.shape();
  start[dim] = from;
  limit[dim] = to;
  return b.slice(x, start, limit);
}

// A 0-d self is treated as 1-element 1-d; returns the wrapped dim.
int64_t prepare(LoweringContext& ctx, Value& x) {
  x = ctx.tensor("self");
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), x.rank());
  if (x.rank() == 0) x = ctx.b.reshape(x, {1});
  return dim;
}

// sort and sort.stable (stable=None/False also sorts stably).
std::vector<Value> sort(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x;
  int64_t dim = prepare(ctx, x);
  if (x.type.numel() == 0) return {b.zeros(ctx.out(0)), b.zeros(ctx.out(1))};
  auto [v, i] = sort_with_indices(b, x, dim, ctx.to_bool("descending", false));
  return {b.reshape(v, ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

// The k largest (smallest) along dim, in sorted order; sorted=False may
// return any order, sorted is one.
std::vector<Value> topk(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x;
  int64_t dim = prepare(ctx, x);
  // (A 0-d input gives itself for k = 0 as for k = 1 on CPU: k is then read as 1.)
  int64_t k = ctx.tensor("self").rank() == 0 ? 1 : ctx.to_int("k", 1);
  if (ctx.out(0).numel() == 0) return {b.zeros(ctx.out(0)), b.zeros(ctx.out(1))};
  auto [v, i] = sort_with_indices(b, x, dim, ctx.to_bool("largest", true));
  return {b.reshape(take(b, v, dim, 0, k), ctx.out(0).shape),
          b.reshape(take(b, i, dim, 0, k), ctx.out(1).shape)};
}

// The k-th smallest (1-based; Meta checked the range).
std::vector<Value> kthvalue(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x;
  int64_t dim = prepare(ctx, x);
  int64_t k = ctx.to_int("k", 1);
  if (ctx.out(0).numel() == 0) return {b.zeros(ctx.out(0)), b.zeros(ctx.out(1))};
  auto [v, i] = sort_with_indices(b, x, dim, false);
  return {b.reshape(take(b, v, dim, k - 1, k), ctx.out(0).shape),
          b.reshape(take(b, i, dim, k - 1, k), ctx.out(1).shape)};
}

// Lower median along dim. median: a row holding NaN gives NaN and the index
// of its first NaN. nanmedian: the lower median of the non-NaN values, NaN for
// an all-NaN row. Without dim (median(self)) the flattened tensor is used and
// only the value is returned; an empty one gives NaN, as on CPU.
std::vector<Value> median_impl(LoweringContext& ctx, bool ignore_nan) {
  Builder& b = ctx.b;
  bool with_dim = ctx.has("dim");
  Value x = ctx.tensor("self");
  int64_t dim = 0;
  if (with_dim) {
    dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
    if (x.rank() == 0) x = b.reshape(x, {1});
  } else {
    x = b.reshape(x, {x.type.numel()});
  }
  int64_t n = x.shape()[dim];
  if (n == 0) {
    // PyTorch's Meta kernel does not check this; CPU raises IndexError, which
    // std::out_of_range stands for here (as in wrap_dim).
    if (with_dim)
      throw std::out_of_range(ctx.op + "(): Expected reduction dim " + std::to_string(dim) +
                              " to have non-zero size.");
    return {b.splat(Scalar::from_float(std::numeric_limits<double>::quiet_NaN()), ctx.out(0))};
  }
  auto [v, i] = sort_with_indices(b, x, dim, false);
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) kept.push_back(d);
  Shape row = x.shape();
  row.erase(row.begin() + dim);
  Value value, index;
  if (!is_float(x.dtype())) {
    value = b.reshape(take(b, v, dim, (n - 1) / 2, (n - 1) / 2 + 1), row);
    index = b.reshape(take(b, i, dim, (n - 1) / 2, (n - 1) / 2 + 1), row);
  } else {
    // NaNs sort last, so the wanted element sits at a per-row position: pick
    // it with a one-hot mask over the sorted dim.
    TensorType it{DType::I64, x.shape()};
    Value isnan = b.compare(Cmp::NE, x, x);
    Value nans = b.reduce(b.convert(isnan, DType::I64), b.constant_int(0, DType::I64), {dim}, "stablehlo.add");
    Value count = b.binary("subtract", b.splat(Scalar::from_int(n), nans.type), nans);
    Value pos;
    if (ignore_nan) {
      // (count - 1) / 2, clamped to 0 for an all-NaN row (then the NaN at 0).
      Value one = b.splat(Scalar::from_int(1), count.type);
      pos = b.binary("divide", b.binary("maximum", b.binary("subtract", count, one), b.zeros(count.type)),
                     b.splat(Scalar::from_int(2), count.type));
    } else {
      // The first NaN (stability keeps NaNs in index order) or the median.
      Value mid = b.splat(Scalar::from_int((n - 1) / 2), count.type);
      pos = b.select(b.compare(Cmp::GT, nans, b.zeros(nans.type)), count, mid);
    }
    Value hit = b.compare(Cmp::EQ, b.iota(it, dim), b.broadcast_in_dim(pos, x.shape(), kept));
    double inf = std::numeric_limits<double>::infinity();
    Value lowest = b.constant(-inf, x.dtype());
    value = b.reduce(b.select(hit, v, b.broadcast_in_dim(lowest, x.shape(), {})), lowest, {dim},
                     "stablehlo.maximum");
    // maximum may drop NaN: restore it where the picked element is NaN.
    Value picked_nan = b.reduce(b.binary("and", hit, b.compare(Cmp::NE, v, v)),
                                b.constant(Scalar::from_bool(false), DType::Bool), {dim}, "stablehlo.or");
    value = b.select(picked_nan, b.splat(Scalar::from_float(std::numeric_limits<double>::quiet_NaN()), value.type),
                     value);
    index = b.reduce(b.select(hit, i, b.zeros(i.type)), b.constant_int(0, DType::I64), {dim}, "stablehlo.add");
  }
  if (!with_dim) return {b.reshape(value, ctx.out(0).shape)};
  return {b.reshape(value, ctx.out(0).shape), b.reshape(index, ctx.out(1).shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("sort", sort);
TORCH_PJRT_LOWERING("topk", topk);
TORCH_PJRT_LOWERING("kthvalue", kthvalue);
TORCH_PJRT_LOWERING("median", [](LoweringContext& c) { return median_impl(c, false); });
TORCH_PJRT_LOWERING("nanmedian", [](LoweringContext& c) { return median_impl(c, true); });

}  // namespace torch_pjrt::lowering::ops
