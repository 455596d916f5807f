// Pooling, 2-d and 3-d, forward and backward: max_pool*_with_indices,
// avg_pool*, _adaptive_avg_pool*, adaptive_max_pool*. The 1-d variants and
// max_poolNd/adaptive_avg_poolNd are CompositeImplicitAutograd over these.
//
// Every lowering works on the input viewed as [P, spatial...] (P = N*C or C)
// and reshapes its result to the shape the Meta kernel gave. Max pooling is
// one variadic reduce_window over (value, flat index) pairs; adaptive
// pooling gathers each output's window elements into a trailing dim
// [P, out..., K]. Indices are flat positions within a plane, as on CPU.
// Half types are accumulated in float32 and rounded once.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

constexpr int64_t kNoIndex = std::numeric_limits<int64_t>::max();  // marks padding in index windows

struct PoolParams {
  Shape kernel, stride, padding, dilation;
};

// PyTorch lets one value stand for every spatial dim; an empty stride means the kernel size.
Shape expand(Shape v, size_t n, int64_t dflt) {
  if (v.empty()) v.push_back(dflt);
  if (v.size() == 1) v.resize(n, v[0]);
  return v;
}

PoolParams pool_params(const LoweringContext& ctx, size_t nd) {
  PoolParams p;
  p.kernel = expand(ctx.ints("kernel_size"), nd, 1);
  p.stride = ctx.ints("stride").empty() ? p.kernel : expand(ctx.ints("stride"), nd, 1);
  p.padding = expand(ctx.ints("padding"), nd, 0);
  p.dilation = expand(ctx.ints("dilation"), nd, 1);
  return p;
}

Shape last(const Shape& s, size_t nd) { return Shape(s.end() - nd, s.end()); }

// x [..., s...] as [P, s...].
Value planes(Builder& b, const Value& x, size_t nd) {
  Shape s{numel(Shape(x.shape().begin(), x.shape().end() - nd))};
  Shape sp = last(x.shape(), nd);
  s.insert(s.end(), sp.begin(), sp.end());
  return b.reshape(x, s);
}

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}

Value lowest(Builder& b, DType dt) {
  switch (dt) {
    case DType::Bool: return b.constant(Scalar::from_bool(false), dt);
    case DType::U8: return b.constant_int(0, dt);
    case DType::I8: return b.constant_int(INT8_MIN, dt);
    case DType::I16: return b.constant_int(INT16_MIN, dt);
    case DType::I32: return b.constant_int(INT32_MIN, dt);
    case DType::I64: return b.constant_int(INT64_MIN, dt);
    default: return b.constant(-std::numeric_limits<double>::infinity(), dt);
  }
}

// Row-major flat position of each element of a plane: i64 [1, s...].
Value flat_index(Builder& b, const Shape& sp) {
  Shape s{1};
  s.insert(s.end(), sp.begin(), sp.end());
  TensorType t{DType::I64, s};
  Value acc = b.zeros(t);
  int64_t step = 1;
  for (int64_t i = static_cast<int64_t>(sp.size()) - 1; i >= 0; --i) {
    acc = b.binary("add", acc, b.binary("multiply", b.iota(t, i + 1), b.splat(Scalar::from_int(step), t)));
    step *= sp[i];
  }
  return acc;
}

// x with dim `dim` replaced by x[..., idx[m], ...] for a 1-d i64 `idx`.
Value take(Builder& b, const Value& x, int64_t dim, const Value& idx) {
  int64_t m = idx.shape()[0];
  Shape out = x.shape(), sizes = x.shape();
  out[dim] = m;
  sizes[dim] = 1;
  std::vector<int64_t> offset;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) offset.push_back(i);
  std::string d = std::to_string(dim);
  return b.op("stablehlo.gather", {x, b.reshape(idx, {m, 1})}, TensorType{x.dtype(), out},
              "dimension_numbers = #stablehlo.gather<offset_dims = " + i64_list(offset) +
                  ", collapsed_slice_dims = [" + d + "], start_index_map = [" + d +
                  "], index_vector_dim = 1>, slice_sizes = " + i64_array(sizes) +
                  ", indices_are_sorted = false");
}

// Windows of adaptive pooling: output o of a dim of size `in` covers
// [floor(o*in/out), ceil((o+1)*in/out)). Each window is read as kmax
// elements (clamped into the input) plus a validity mask.
struct AdaptiveWindows {
  Value values;                // [P, out..., K]
  Value index;                 // i64 [1, out..., K], flat position in the plane
  Value valid;                 // bool [1, out..., K]
  std::vector<Value> counts;   // per dim: i64 [out_i], window length
};

AdaptiveWindows adaptive_windows(Builder& b, Value x, const Shape& out) {
  size_t nd = out.size();
  Shape sp(x.shape().begin() + 1, x.shape().end());
  Value idx = flat_index(b, sp);
  std::vector<Value> valid_dims;
  AdaptiveWindows w;
  Shape split{1}, grid;  // [o1, k1, o2, k2, ...]
  for (size_t i = 0; i < nd; ++i) {
    int64_t in = sp[i], o = out[i], kmax = 0;
    for (int64_t j = 0; j < o; ++j)
      kmax = std::max(kmax, ((j + 1) * in + o - 1) / o - (j * in) / o);
    kmax = std::max<int64_t>(kmax, 1);
    TensorType t{DType::I64, {o, kmax}}, v{DType::I64, {o}};
    auto c = [&](int64_t k, const TensorType& ty) { return b.splat(Scalar::from_int(k), ty); };
    auto start_end = [&](const Value& ov, const TensorType& ty) {
      Value start = b.binary("divide", b.binary("multiply", ov, c(in, ty)), c(o, ty));
      Value end = b.binary("divide", b.binary("add", b.binary("multiply", b.binary("add", ov, c(1, ty)), c(in, ty)),
                                               c(o - 1, ty)), c(o, ty));
      return std::make_pair(start, end);
    };
    auto [start, end] = start_end(b.iota(t, 0), t);
    Value pos = b.binary("add", start, b.iota(t, 1));
    valid_dims.push_back(b.compare(Cmp::LT, pos, end));
    pos = b.reshape(b.binary("minimum", pos, c(in - 1, t)), {o * kmax});
    x = take(b, x, static_cast<int64_t>(i) + 1, pos);
    idx = take(b, idx, static_cast<int64_t>(i) + 1, pos);
    auto [s1, e1] = start_end(b.iota(v, 0), v);
    w.counts.push_back(b.binary("subtract", e1, s1));
    grid.push_back(o);
    grid.push_back(kmax);
  }
  // [P, o1*k1, ...] -> [P, o1, k1, ...] -> [P, o1, o2, ..., k1, k2, ...] -> [P, out..., K]
  std::vector<int64_t> perm{0};
  for (size_t i = 0; i < nd; ++i) perm.push_back(2 * i + 1);
  for (size_t i = 0; i < nd; ++i) perm.push_back(2 * i + 2);
  auto arrange = [&](const Value& v) {
    Shape s{v.shape()[0]};
    s.insert(s.end(), grid.begin(), grid.end());
    Shape r{v.shape()[0]};
    r.insert(r.end(), out.begin(), out.end());
    int64_t k = 1;
    for (size_t i = 0; i < nd; ++i) k *= grid[2 * i + 1];
    r.push_back(k);
    return b.reshape(b.transpose(b.reshape(v, s), perm), r);
  };
  Shape grid1{1};
  grid1.insert(grid1.end(), grid.begin(), grid.end());
  Value valid;
  for (size_t i = 0; i < nd; ++i) {
    Value vi = b.broadcast_in_dim(valid_dims[i], grid1, {static_cast<int64_t>(2 * i + 1), static_cast<int64_t>(2 * i + 2)});
    valid = i ? b.binary("and", valid, vi) : vi;
  }
  w.values = arrange(x);
  w.index = arrange(idx);
  w.valid = arrange(valid);
  return w;
}

// Max over the trailing window dim with the index CPU picks: its kernels
// replace on `val > max || isnan(val)`, so the first maximal element wins, or
// the last NaN when there is one. Windows marked kNoIndex are padding.
std::pair<Value, Value> window_max(Builder& b, const Value& v, const Value& idx) {
  int64_t kd = v.rank() - 1;
  auto keep = range(0, kd);
  Value m = b.reduce(v, lowest(b, v.dtype()), {kd}, "stablehlo.maximum");
  Value hit = b.compare(Cmp::EQ, v, b.broadcast_in_dim(m, v.shape(), keep));
  Value none = b.constant_int(kNoIndex, DType::I64);
  Value first = b.reduce(b.select(hit, idx, b.splat(Scalar::from_int(kNoIndex), idx.type)), none, {kd},
                         "stablehlo.minimum");
  if (!is_float(v.dtype())) return {m, first};
  Value isnan = b.compare(Cmp::NE, v, v);
  Value any = b.reduce(isnan, b.constant(Scalar::from_bool(false), DType::Bool), {kd}, "stablehlo.or");
  Value last_nan = b.reduce(b.select(isnan, idx, b.splat(Scalar::from_int(-1), idx.type)),
                            b.constant_int(-1, DType::I64), {kd}, "stablehlo.maximum");
  return {b.select(any, splat_like(b, std::numeric_limits<double>::quiet_NaN(), m), m),
          b.select(any, last_nan, first)};
}

// Sum of `upd` [P, ...] into a zero plane [P, S] at flat positions `idx` (same shape).
Value scatter_add(Builder& b, const Value& upd, const Value& idx, int64_t plane_size) {
  int64_t p = upd.shape()[0], m = numel(upd.shape()) / std::max<int64_t>(p, 1);
  if (p == 0) m = 0;
  TensorType it{DType::I64, {p, m}};
  Value ind = b.concatenate({b.reshape(b.iota(it, 0), {p, m, 1}), b.reshape(idx, {p, m, 1})}, 2);
  return b.scatter_elements(b.zeros(TensorType{upd.dtype(), {p, plane_size}}), ind, b.reshape(upd, {p, m}),
                            "stablehlo.add");
}

// stablehlo.reduce_window of the operands `xs` (same shape) with `inits`,
// padded by lo/hi (with the inits), reduced by `region`.
std::vector<Value> reduce_window(Builder& b, const std::vector<Value>& xs, const std::vector<Value>& inits,
                                 const Shape& window, const Shape& strides, const Shape& dilations, const Shape& lo,
                                 const Shape& hi, const std::string& region) {
  const Value& x = xs[0];
  Shape out;
  std::string pad = "dense<[";
  for (int64_t i = 0; i < x.rank(); ++i) {
    out.push_back((x.shape()[i] + lo[i] + hi[i] - dilations[i] * (window[i] - 1) - 1) / strides[i] + 1);
    pad += (i ? ", [" : "[") + std::to_string(lo[i]) + ", " + std::to_string(hi[i]) + "]";
  }
  pad += "]> : tensor<" + std::to_string(x.rank()) + "x2xi64>";
  std::vector<Value> operands = xs;
  std::vector<TensorType> types;
  for (const Value& v : xs) types.push_back(TensorType{v.dtype(), out});
  operands.insert(operands.end(), inits.begin(), inits.end());
  return b.op_multi("stablehlo.reduce_window", operands, types,
                    "padding = " + pad + ", window_dimensions = " + i64_array(window) + ", window_strides = " +
                        i64_array(strides) + ", window_dilations = " + i64_array(dilations),
                    region);
}

Value reduce_window_sum(Builder& b, const Value& x, const Shape& window, const Shape& strides,
                        const Shape& lo, const Shape& hi) {
  return reduce_window(b, {x}, {b.constant(0.0, x.dtype())}, window, strides, Shape(x.rank(), 1), lo, hi,
                       b.binary_region(x.dtype(), "stablehlo.add"))[0];
}

// ---- lowerings ------------------------------------------------------------------------------

// (value, index) pairs ordered so that the greatest is the element CPU's
// kernels keep (see window_max): any NaN above every number, the last NaN
// first among NaNs, then the larger value, then the first index. A total
// order, so a reduction in any order picks the same pair.
std::vector<Value> max_pair(Builder& b, const std::vector<Value>& s) {
  const Value &v1 = s[0], &i1 = s[1], &v2 = s[2], &i2 = s[3];
  Value second = b.binary("or", b.compare(Cmp::GT, v2, v1),
                          b.binary("and", b.compare(Cmp::EQ, v2, v1), b.compare(Cmp::LT, i2, i1)));
  if (is_float(v1.dtype())) {
    Value n1 = b.compare(Cmp::NE, v1, v1), n2 = b.compare(Cmp::NE, v2, v2);
    Value nan_wins = b.binary("and", n2, b.binary("or", b.unary("not", n1), b.compare(Cmp::GT, i2, i1)));
    second = b.binary("or", nan_wins, b.binary("and", second, b.unary("not", n1)));
  }
  return {b.select(second, v2, v1), b.select(second, i2, i1)};
}

// One variadic reduce_window over (values, flat indices): no window is
// materialized, and the program's size does not grow with the kernel.
// x [P, in...] -> (max [P, out...], flat index [P, out...]).
std::pair<Value, Value> max_windows(Builder& b, const Value& x, const PoolParams& p, const Shape& out) {
  const size_t nd = out.size();
  Shape in = last(x.shape(), nd);
  Value idx = b.broadcast_in_dim(flat_index(b, in), x.shape(), range(0, x.rank()));
  Shape window{1}, strides{1}, dil{1}, lo{0}, hi{0}, size{x.shape()[0]};
  for (size_t i = 0; i < nd; ++i) {
    window.push_back(p.kernel[i]);
    strides.push_back(p.stride[i]);
    dil.push_back(p.dilation[i]);
    size.push_back(out[i]);
    lo.push_back(p.padding[i]);
    // ceil_mode's last window may run past the padding.
    hi.push_back(std::max<int64_t>(
        (out[i] - 1) * p.stride[i] + p.dilation[i] * (p.kernel[i] - 1) + 1 - in[i] - p.padding[i], 0));
  }
  TensorType vs{x.dtype(), {}}, is{DType::I64, {}};
  std::vector<Value> r = reduce_window(b, {x, idx}, {lowest(b, x.dtype()), b.constant_int(kNoIndex, DType::I64)},
                                       window, strides, dil, lo, hi, b.region({vs, is, vs, is}, max_pair));
  Shape zero(nd + 1, 0);
  Value index = b.slice(r[1], zero, size);
  // A window wholly in the padding (dilation can make one): CPU's index is
  // its first position moved into the plane by whole dilation steps.
  Shape os{1};
  os.insert(os.end(), out.begin(), out.end());
  TensorType ot{DType::I64, os};
  Value start = b.zeros(ot);
  int64_t step = 1;
  for (int64_t i = static_cast<int64_t>(nd) - 1; i >= 0; --i) {
    auto c = [&](int64_t v) { return b.splat(Scalar::from_int(v), ot); };
    Value s0 = b.binary("subtract", b.binary("multiply", b.iota(ot, i + 1), c(p.stride[i])), c(p.padding[i]));
    // s0 < 0: add ceil(-s0 / dilation) steps.
    Value steps = b.binary("divide", b.binary("add", b.unary("negate", s0), c(p.dilation[i] - 1)), c(p.dilation[i]));
    s0 = b.select(b.compare(Cmp::LT, s0, c(0)), b.binary("add", s0, b.binary("multiply", steps, c(p.dilation[i]))), s0);
    start = b.binary("add", start, b.binary("multiply", s0, c(step)));
    step *= in[i];
  }
  index = b.select(b.compare(Cmp::EQ, index, b.splat(Scalar::from_int(kNoIndex), index.type)),
                   b.broadcast_in_dim(start, index.shape(), range(0, index.rank())), index);
  return {b.slice(r[0], zero, size), index};
}

std::vector<Value> max_pool(LoweringContext& ctx, size_t nd) {
  auto [m, i] = max_windows(ctx.b, planes(ctx.b, ctx.tensor("self"), nd), pool_params(ctx, nd), last(ctx.out(0).shape, nd));
  return {ctx.b.reshape(m, ctx.out(0).shape), ctx.b.reshape(i, ctx.out(1).shape)};
}

// max_pool*_with_indices_backward and adaptive_max_pool*_backward: each output's
// gradient goes to the input element its index names.
std::vector<Value> max_pool_backward(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  DType md = math_dtype(ctx.out().dtype);
  Value g = planes(b, b.convert(ctx.tensor("grad_output"), md), nd);
  Value idx = planes(b, ctx.tensor("indices"), nd);
  Value r = scatter_add(b, g, b.convert(idx, DType::I64), numel(last(self.shape(), nd)));
  return {b.reshape(r, ctx.out().shape)};
}

// Per-dim divisor of avg_pool for each output position: i64 [out].
Value avg_divisor(Builder& b, int64_t in, int64_t out, int64_t k, int64_t s, int64_t pad, bool include_pad) {
  TensorType t{DType::I64, {out}};
  auto c = [&](int64_t v) { return b.splat(Scalar::from_int(v), t); };
  Value start = b.binary("subtract", b.binary("multiply", b.iota(t, 0), c(s)), c(pad));
  Value end = b.binary("minimum", b.binary("add", start, c(k)), c(in + pad));
  if (include_pad) return b.binary("subtract", end, start);
  return b.binary("subtract", b.binary("minimum", end, c(in)), b.binary("maximum", start, c(0)));
}

// Window sizes of avg_pool as a [1, out...] tensor of dtype `dt`.
Value avg_divisors(LoweringContext& ctx, const PoolParams& p, const Shape& in, const Shape& out, DType dt) {
  Builder& b = ctx.b;
  Shape s{1};
  s.insert(s.end(), out.begin(), out.end());
  if (ctx.has("divisor_override")) return b.splat(Scalar::from_int(ctx.to_int("divisor_override", 1)), TensorType{dt, s});
  bool include_pad = ctx.to_bool("count_include_pad", true);
  Value d;
  for (size_t i = 0; i < out.size(); ++i) {
    Value di = b.broadcast_in_dim(avg_divisor(b, in[i], out[i], p.kernel[i], p.stride[i], p.padding[i], include_pad),
                                  s, {static_cast<int64_t>(i) + 1});
    d = i ? b.binary("multiply", d, di) : di;
  }
  return b.convert(d, dt);
}

std::vector<Value> avg_pool(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  DType md = math_dtype(ctx.out().dtype);
  Value x = planes(b, b.convert(ctx.tensor("self"), md), nd);
  PoolParams p = pool_params(ctx, nd);
  Shape in = last(x.shape(), nd), out = last(ctx.out().shape, nd);
  Shape window{1}, strides{1}, lo{0}, hi{0}, size{x.shape()[0]};
  for (size_t i = 0; i < nd; ++i) {
    window.push_back(p.kernel[i]);
    strides.push_back(p.stride[i]);
    lo.push_back(p.padding[i]);
    hi.push_back(std::max<int64_t>((out[i] - 1) * p.stride[i] + p.kernel[i] - in[i] - p.padding[i], 0));
    size.push_back(out[i]);
  }
  Value sum = b.slice(reduce_window_sum(b, x, window, strides, lo, hi), Shape(nd + 1, 0), size);
  Value d = b.broadcast_in_dim(avg_divisors(ctx, p, in, out, md), sum.shape(), range(0, nd + 1));
  return {b.reshape(b.binary("divide", sum, d), ctx.out().shape)};
}

// The transpose of the strided window sum: the gradient (divided by each
// window's divisor) dilated by the stride, padded, summed over stride-1 windows.
std::vector<Value> avg_pool_backward(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  DType md = math_dtype(ctx.out().dtype);
  Value g = planes(b, b.convert(ctx.tensor("grad_output"), md), nd);
  PoolParams p = pool_params(ctx, nd);
  Shape in = last(ctx.tensor("self").shape(), nd), out = last(g.shape(), nd);
  g = b.binary("divide", g, b.broadcast_in_dim(avg_divisors(ctx, p, in, out, md), g.shape(), range(0, nd + 1)));
  Shape lo{0}, hi{0}, interior{0}, window{1}, ones(nd + 1, 1), zeros(nd + 1, 0);
  for (size_t i = 0; i < nd; ++i) {
    lo.push_back(p.kernel[i] - 1 - p.padding[i]);
    hi.push_back(in[i] + p.padding[i] - (out[i] - 1) * p.stride[i] - 1);
    interior.push_back(p.stride[i] - 1);
    window.push_back(p.kernel[i]);
  }
  Value gp = b.pad(g, b.constant(0.0, md), lo, hi, interior);
  return {b.reshape(reduce_window_sum(b, gp, window, ones, zeros, zeros), ctx.out().shape)};
}

std::vector<Value> adaptive_avg_pool(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  DType md = math_dtype(ctx.out().dtype);
  Value x = planes(b, b.convert(ctx.tensor("self"), md), nd);
  AdaptiveWindows w = adaptive_windows(b, x, last(ctx.out().shape, nd));
  int64_t kd = w.values.rank() - 1;
  Value valid = b.broadcast_in_dim(w.valid, w.values.shape(), range(0, kd + 1));
  Value r = b.reduce(b.select(valid, w.values, b.zeros(w.values.type)), b.constant(0.0, md), {kd}, "stablehlo.add");
  // CPU divides by each window length in turn.
  for (size_t i = 0; i < nd; ++i)
    r = b.binary("divide", r, b.broadcast_in_dim(b.convert(w.counts[i], md), r.shape(), {static_cast<int64_t>(i) + 1}));
  return {b.reshape(r, ctx.out().shape)};
}

std::vector<Value> adaptive_avg_pool_backward(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  DType md = math_dtype(ctx.out().dtype);
  Value x = planes(b, ctx.tensor("self"), nd);
  Value g = planes(b, b.convert(ctx.tensor("grad_output"), md), nd);
  AdaptiveWindows w = adaptive_windows(b, x, last(g.shape(), nd));
  for (size_t i = 0; i < nd; ++i)
    g = b.binary("divide", g, b.broadcast_in_dim(b.convert(w.counts[i], md), g.shape(), {static_cast<int64_t>(i) + 1}));
  const Shape& ws = w.values.shape();
  int64_t kd = w.values.rank() - 1;
  Value upd = b.select(b.broadcast_in_dim(w.valid, ws, range(0, kd + 1)), b.broadcast_in_dim(g, ws, range(0, kd)),
                       b.zeros(TensorType{md, ws}));
  Value r = scatter_add(b, upd, b.broadcast_in_dim(w.index, ws, range(0, kd + 1)), numel(last(x.shape(), nd)));
  return {b.reshape(r, ctx.out().shape)};
}

std::vector<Value> adaptive_max_pool(LoweringContext& ctx, size_t nd) {
  Builder& b = ctx.b;
  Value x = planes(b, ctx.tensor("self"), nd);
  Shape in = last(x.shape(), nd), out = last(ctx.out(0).shape, nd);
  bool even = true;
  for (size_t i = 0; i < nd; ++i) even &= out[i] > 0 && in[i] % out[i] == 0;
  if (even && x.type.numel() > 0) {  // equal windows side by side: a strided max pool (same picks)
    PoolParams p{Shape(nd), Shape(nd), Shape(nd, 0), Shape(nd, 1)};
    for (size_t i = 0; i < nd; ++i) p.kernel[i] = p.stride[i] = in[i] / out[i];
    auto [m, i] = max_windows(b, x, p, out);
    return {b.reshape(m, ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
  }
  AdaptiveWindows w = adaptive_windows(b, x, last(ctx.out(0).shape, nd));
  const Shape& ws = w.values.shape();
  auto all = range(0, w.values.rank());
  Value valid = b.broadcast_in_dim(w.valid, ws, all);
  Value v = b.select(valid, w.values, b.broadcast_in_dim(lowest(b, x.dtype()), ws, {}));
  Value idx = b.select(valid, b.broadcast_in_dim(w.index, ws, all), b.splat(Scalar::from_int(kNoIndex), TensorType{DType::I64, ws}));
  auto [m, i] = window_max(b, v, idx);
  return {b.reshape(m, ctx.out(0).shape), b.reshape(i, ctx.out(1).shape)};
}

}  // namespace

#define TP_POOL(name, fn, nd) \
  TORCH_PJRT_LOWERING(name, [](LoweringContext& c) { return fn(c, nd); })

TP_POOL("max_pool2d_with_indices", max_pool, 2);
TP_POOL("max_pool3d_with_indices", max_pool, 3);
TP_POOL("max_pool2d_with_indices_backward", max_pool_backward, 2);
TP_POOL("max_pool3d_with_indices_backward", max_pool_backward, 3);
TP_POOL("avg_pool2d", avg_pool, 2);
TP_POOL("avg_pool3d", avg_pool, 3);
TP_POOL("avg_pool2d_backward", avg_pool_backward, 2);
TP_POOL("avg_pool3d_backward", avg_pool_backward, 3);
TP_POOL("_adaptive_avg_pool2d", adaptive_avg_pool, 2);
TP_POOL("_adaptive_avg_pool3d", adaptive_avg_pool, 3);
TP_POOL("_adaptive_avg_pool2d_backward", adaptive_avg_pool_backward, 2);
TP_POOL("_adaptive_avg_pool3d_backward", adaptive_avg_pool_backward, 3);
TP_POOL("adaptive_max_pool2d", adaptive_max_pool, 2);
TP_POOL("adaptive_max_pool3d", adaptive_max_pool, 3);
TP_POOL("adaptive_max_pool2d_backward", max_pool_backward, 2);
TP_POOL("adaptive_max_pool3d_backward", max_pool_backward, 3);

}  // namespace torch_pjrt::lowering::ops
