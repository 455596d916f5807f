// F.interpolate: upsample_nearest{1,2,3}d, _upsample_nearest_exact{1,2,3}d,
// upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d,
// upsample_bicubic2d, the antialiased _upsample_bilinear2d_aa and
// _upsample_bicubic2d_aa (float32/float64; uint8 takes CPU's fixed-point
// kernel) and their backward ops. (The .vec overloads are
// CompositeImplicitAutograd: they compute output_size/scales and call these.)
//
// Each resized dim is separable: output[o] = sum_k w_k[o] * input[idx_k[o]].
// The source indices and weights depend only on sizes, scales and
// align_corners, so they are computed here on the host with PyTorch's CPU
// formulas in its precision (float, or double for float64 inputs: opmath) and
// embedded as constants; the program gathers along the dim (forward) or
// scatter-adds into it (backward). The last dim is resized first, as the CPU
// kernel nests its loops, and the backward applies the adjoints in reverse.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

enum class Kind { Nearest, NearestExact, Linear, Cubic, LinearAA, CubicAA };

// Source indices and weights of one resized dim, tap-major: idx[k][o].
struct Taps {
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<double>> w;  // empty for nearest
  bool linear = false;                 // w[0] is 1 - w[1], computed in the input dtype
  // Antialiased: output o has taps k < size[o] only (a window as wide as the
  // scale; the rest pad the tap count, their terms not added).
  std::vector<int64_t> size;
};

// ---- PyTorch's index arithmetic (aten/src/ATen/native/UpSample.h), T = opmath type ----

template <typename T>
T scales_value(std::optional<double> scale, int64_t in, int64_t out) {
  return scale && *scale > 0. ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / out;
}

template <typename T>
T pixel_scale(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  if (align_corners) return out > 1 ? static_cast<T>(in - 1) / (out - 1) : T(0);
  return scales_value<T>(scale, in, out);
}

template <typename T>
T source_index(T scale, int64_t dst, bool align_corners, bool cubic) {
  if (align_corners) return scale * dst;
  T src = scale * (dst + T(0.5)) - T(0.5);
  return !cubic && src < T(0) ? T(0) : src;
}

template <typename T>
void index_and_lambda(T real, int64_t in, int64_t& index, T& lambda) {
  index = std::min(static_cast<int64_t>(floorf(real)), in - 1);
  lambda = std::min(std::max(real - index, T(0)), T(1));
}

template <typename T>
T cubic1(T x, T a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
template <typename T>
T cubic2(T x, T a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }

// `backward` selects the CPU backward kernels' variants where they differ
// from the forward ones (nearest shortcuts; bicubic copying equal sizes).
template <typename T>
Taps compute_taps(Kind kind, int64_t in, int64_t out, bool align_corners, std::optional<double> scale,
                  bool backward) {
  Taps t;
  if (kind == Kind::Nearest || kind == Kind::NearestExact) {
    t.idx.assign(1, std::vector<int64_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      int64_t i;
      if (kind == Kind::Nearest) {
        if (backward && out == in) {
          i = o;
        } else if (backward && out == 2 * in) {
          i = o >> 1;
        } else {
          float fs = backward ? scales_value<float>(scale, in, out) : 0.f;
          i = backward ? static_cast<int64_t>(floorf(o * fs))
                       : static_cast<int64_t>(floorf(source_index<T>(scales_value<T>(scale, in, out), o, true, false)));
        }
      } else if (backward) {
        i = static_cast<int64_t>(floorf((o + 0.5) * scales_value<float>(scale, in, out)));
      } else {
        T real = source_index<T>(scales_value<T>(scale, in, out), o, false, false);
        i = static_cast<int64_t>(floorf(real + 0.5));
      }
      t.idx[0][o] = std::min(i, in - 1);
    }
    return t;
  }
  T s = pixel_scale<T>(in, out, align_corners, scale);
  if (kind == Kind::Linear) {
    t.linear = true;
    t.idx.assign(2, std::vector<int64_t>(out));
    t.w.assign(2, std::vector<double>(out));
    for (int64_t o = 0; o < out; ++o) {
      int64_t i0;
      T l1;
      if (in == out) {
        i0 = o;
        l1 = T(0);
      } else {
        index_and_lambda<T>(source_index<T>(s, o, align_corners, false), in, i0, l1);
      }
      t.idx[0][o] = i0;
      t.idx[1][o] = i0 + (i0 < in - 1 ? 1 : 0);
      t.w[1][o] = l1;
      t.w[0][o] = T(1) - l1;
    }
    return t;
  }
  // Cubic convolution with A = -0.75; taps at index-1 .. index+2, clamped.
  t.idx.assign(4, std::vector<int64_t>(out));
  t.w.assign(4, std::vector<double>(out));
  const T A = T(-0.75);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    T l;
    if (backward && in == out) {
      i = o;
      l = T(0);
    } else {
      index_and_lambda<T>(source_index<T>(s, o, align_corners, true), in, i, l);
    }
    T c[4] = {cubic2<T>(l + T(1), A), cubic1<T>(l, A), cubic1<T>(T(1) - l, A), cubic2<T>(T(1) - l + T(1), A)};
    for (int k = 0; k < 4; ++k) {
      t.idx[k][o] = std::max<int64_t>(std::min<int64_t>(i + k - 1, in - 1), 0);
      t.w[k][o] = c[k];
    }
  }
  return t;
}

// Antialiased (PIL's filters, as PyTorch's CPU kernel computes them in the
// input's dtype T, with its mixed float/double arithmetic): a window of input
// samples around each output's center, as wide as the downscale, weighted by
// the filter stretched by it and normalized. `backward` sizes the tap count
// as the backward kernel does (ceilf).
template <typename T>
T aa_filter(Kind kind, T x) {
  x = std::abs(x);
  if (kind == Kind::LinearAA) return x < 1.0 ? static_cast<T>(1.0 - x) : T(0);
  const T a = T(-0.5);  // Keys' cubic (PIL); the plain bicubic uses -0.75
  if (x < 1.0) return cubic1<T>(x, a);
  if (x < 2.0) return cubic2<T>(x, a);
  return T(0);
}

template <typename T>
Taps aa_taps(Kind kind, int64_t in, int64_t out, bool align_corners, std::optional<double> scale_arg,
             bool backward) {
  const int interp = kind == Kind::LinearAA ? 2 : 4;
  const T scale = pixel_scale<T>(in, out, align_corners, scale_arg);
  const T support = scale >= 1.0 ? (interp * 0.5) * scale : interp * 0.5;
  const int64_t taps = backward ? static_cast<int64_t>(ceilf(static_cast<float>(support))) * 2 + 1
                                : static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const T invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  Taps t;
  t.idx.assign(taps, std::vector<int64_t>(out));
  t.w.assign(taps, std::vector<double>(out, 0.0));
  t.size.assign(out, 0);
  for (int64_t o = 0; o < out; ++o) {
    const T center = scale * (o + 0.5);
    int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t(0));
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin;
    xsize = std::clamp<int64_t>(xsize, 0, taps);
    std::vector<T> w(taps, T(0));
    T total = 0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = aa_filter<T>(kind, static_cast<T>((j + xmin - center + 0.5) * invscale));
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    for (int64_t k = 0; k < taps; ++k) {
      t.idx[k][o] = std::min(xmin + (k < xsize ? k : 0), in - 1);
      t.w[k][o] = w[k];
    }
    t.size[o] = xsize;
  }
  return t;
}

// ---- program pieces ------------------------------------------------------------------

std::string hex(uint64_t bits, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%0*llX", digits, static_cast<unsigned long long>(bits));
  return buf;
}

// A 1-D constant of int64 (dt I64) or float (F32/F64) values.
template <typename V>
Value const_vector(Builder& b, const std::vector<V>& v, DType dt) {
  std::string lit;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) lit += ", ";
    if (dt == DType::I64) {
      lit += std::to_string(static_cast<int64_t>(v[i]));
    } else if (dt == DType::F32) {
      float f = static_cast<float>(v[i]);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      lit += hex(bits, 8);
    } else {
      double d = static_cast<double>(v[i]);
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      lit += hex(bits, 16);
    }
  }
  TensorType t{dt, {int64_t(v.size())}};
  return b.op("stablehlo.constant", {}, t, "value = dense<[" + lit + "]> : " + t.str());
}

std::string dims_except(int64_t rank, int64_t d) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < rank; ++i)
    if (i != d) v.push_back(i);
  return i64_list(v);
}

// x[..., idx[o], ...] along dim d.
Value take(Builder& b, const Value& x, const std::vector<int64_t>& idx, int64_t d) {
  int64_t n = int64_t(idx.size());
  Value i = b.reshape(const_vector(b, idx, DType::I64), {n, 1});
  Shape out = x.shape(), slice = x.shape();
  out[d] = n;
  slice[d] = 1;
  return b.op("stablehlo.gather", {x, i}, TensorType{x.dtype(), out},
              "dimension_numbers = #stablehlo.gather<offset_dims = " + dims_except(x.rank(), d) +
                  ", collapsed_slice_dims = [" + std::to_string(d) + "], start_index_map = [" +
                  std::to_string(d) + "], index_vector_dim = 1>, slice_sizes = " + i64_array(slice) +
                  ", indices_are_sorted = false");
}

// zeros of size `n` along d, with upd[..., j, ...] added at idx[j].
Value scatter_add(Builder& b, const Value& upd, const std::vector<int64_t>& idx, int64_t d, int64_t n) {
  int64_t m = int64_t(idx.size());
  Value i = b.reshape(const_vector(b, idx, DType::I64), {m, 1});
  Shape shape = upd.shape();
  shape[d] = n;
  Value zeros = b.zeros(TensorType{upd.dtype(), shape});
  return b.op_multi("stablehlo.scatter", {zeros, i, upd}, {zeros.type},
                    "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " +
                        dims_except(upd.rank(), d) + ", inserted_window_dims = [" + std::to_string(d) +
                        "], scatter_dims_to_operand_dims = [" + std::to_string(d) +
                        "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false",
                    b.binary_region(upd.dtype(), "stablehlo.add"))[0];
}

// The weights of tap k broadcast along dim d of `like`. The CPU forward kernels
// store weights in the input dtype (`round_to`); the backward ones keep opmath.
std::vector<Value> weights(Builder& b, const Taps& t, const TensorType& like, int64_t d, DType round_to) {
  DType wt = like.dtype;
  auto rounded = [&](const Value& v) { return rounded_to(b, v, round_to); };
  std::vector<Value> ws;
  for (const auto& w : t.w) ws.push_back(rounded(const_vector(b, w, wt)));
  if (t.linear) ws[0] = rounded(b.binary("subtract", splat_like(b, 1.0, ws[1]), ws[1]));
  for (auto& w : ws) w = b.broadcast_in_dim(w, like.shape, {d});
  return ws;
}

// Antialiased windows (as wide as the downscale: a 20,000 -> 2 resize has
// 20,001 taps) take every tap in one gather, weighted and summed over a taps
// dim, so the program's size does not grow with the width (an op per tap
// did not compile in 6 minutes at that width). Padding taps are masked out;
// XLA's sum order is not CPU's sequential one: float rounding apart.
// The taps of dim d as a [.., out, K, ..] layout: flat gather indices, the
// weights (rounded to `round_to` as weights() does) and the mask of the taps
// each output adds, broadcast to `split`.
struct WideTaps {
  Shape split;
  std::vector<int64_t> idx;
  Value w, mask;
};

WideTaps wide_taps(Builder& b, const Taps& t, Shape shape, int64_t d, DType dt, DType round_to, bool first_always) {
  int64_t out = static_cast<int64_t>(t.idx[0].size()), K = static_cast<int64_t>(t.idx.size());
  WideTaps wt;
  std::vector<double> w(out * K);
  std::vector<int64_t> has(out * K);
  wt.idx.resize(out * K);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < K; ++k) {
      wt.idx[o * K + k] = t.idx[k][o];
      w[o * K + k] = t.w[k][o];
      has[o * K + k] = (first_always && k == 0) || k < t.size[o];
    }
  shape[d] = out;
  shape.insert(shape.begin() + d + 1, K);
  wt.split = shape;
  Value wv = const_vector(b, w, dt);
  if (round_to != dt) wv = b.convert(b.convert(wv, round_to), dt);
  wt.w = b.broadcast_in_dim(b.reshape(wv, {out, K}), shape, {d, d + 1});
  Value m = b.convert(const_vector(b, has, DType::I64), DType::Bool);
  wt.mask = b.broadcast_in_dim(b.reshape(m, {out, K}), shape, {d, d + 1});
  return wt;
}

// ---- the ops ------------------------------------------------------------------------

struct Spec {
  Kind kind;
  int nd;            // resized dims
  bool has_align;    // linear/cubic take align_corners
};

std::vector<std::optional<double>> scales_of(const LoweringContext& ctx, int nd) {
  static const char* names3[] = {"scales_d", "scales_h", "scales_w"};
  std::vector<std::optional<double>> s;
  for (int i = 0; i < nd; ++i) {
    const char* name = nd == 1 ? "scales" : names3[3 - nd + i];
    s.push_back(ctx.has(name) ? std::optional<double>(ctx.to_double(name, 0.0)) : std::nullopt);
  }
  return s;
}

bool antialiased(Kind k) { return k == Kind::LinearAA || k == Kind::CubicAA; }

Taps taps_for(const Spec& sp, DType dt, int64_t in, int64_t out, bool align, std::optional<double> scale,
              bool backward) {
  if (antialiased(sp.kind))
    return dt == DType::F64 ? aa_taps<double>(sp.kind, in, out, align, scale, backward)
                            : aa_taps<float>(sp.kind, in, out, align, scale, backward);
  return dt == DType::F64 ? compute_taps<double>(sp.kind, in, out, align, scale, backward)
                          : compute_taps<float>(sp.kind, in, out, align, scale, backward);
}

// The dtypes CPU's kernels implement: floating types (float32/float64 only
// antialiased), and uint8 images for nearest and the 2-d bilinear/bicubic;
// for the rest CPU's NotImplementedError.
void check_dtype(LoweringContext& ctx, const Spec& sp, DType dt, bool backward) {
  const char* mode = sp.kind == Kind::LinearAA ? "bilinear" : "bicubic";
  if (antialiased(sp.kind)) {
    if (dt == DType::F32 || dt == DType::F64) return;
    ctx.kernel_not_implemented(backward ? std::string("upsample_") + mode + "2d_aa_backward_cpu"
                                        : std::string("compute_index_ranges_weights"),
                               dt);
  }
  bool nearest = sp.kind == Kind::Nearest || sp.kind == Kind::NearestExact;
  if (is_float(dt) || (dt == DType::U8 && !backward && (nearest || sp.nd == 2))) return;
  ctx.kernel_not_implemented(std::string("compute_indices_weights_") +
                                 (nearest ? "nearest" : sp.kind == Kind::Linear ? "linear" : "cubic"),
                             dt);
}

std::vector<Value> upsample(LoweringContext& ctx, Spec sp) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value x = ctx.tensor("self");
  DType in_dt = x.dtype();
  check_dtype(ctx, sp, in_dt, false);
  if (out.numel() == 0) return {b.zeros(out)};
  bool align = sp.has_align && ctx.to_bool("align_corners", false);
  auto scales = scales_of(ctx, sp.nd);
  bool nearest = sp.kind == Kind::Nearest || sp.kind == Kind::NearestExact;
  // Integer images (uint8) interpolate in float32 and, like CPU's separable
  // uint8 kernel, round half up and clamp after each dimension's pass.
  bool integral = !is_float(in_dt);
  // (CPU's 2-d bilinear kernel keeps float16/bfloat16 weights in float32;
  // its linear, trilinear and bicubic kernels round them to the input dtype)
  DType weight_dt = integral ? DType::F32 : sp.kind == Kind::Linear && sp.nd == 2 ? math_dtype(in_dt) : in_dt;
  if (!nearest) x = b.convert(x, integral ? DType::F32 : math_dtype(in_dt));
  for (int i = sp.nd - 1; i >= 0; --i) {
    int64_t d = x.rank() - sp.nd + i;
    // (CPU's antialiased kernel skips a dim whose size stays.)
    if (antialiased(sp.kind) && x.shape()[d] == out.shape[d]) continue;
    Taps t = taps_for(sp, in_dt, x.shape()[d], out.shape[d], align, scales[i], false);
    if (nearest) {
      x = take(b, x, t.idx[0], d);
      continue;
    }
    if (antialiased(sp.kind)) {
      WideTaps wt = wide_taps(b, t, x.shape(), d, x.dtype(), weight_dt, /*first_always=*/true);
      Value g = b.reshape(take(b, x, wt.idx, d), wt.split);
      Value terms = b.select(wt.mask, b.binary("multiply", g, wt.w), b.zeros(g.type));
      x = b.reduce(terms, b.constant(0.0, x.dtype()), {d + 1}, "stablehlo.add");
      continue;
    }
    Shape gathered = x.shape();
    gathered[d] = out.shape[d];
    auto ws = weights(b, t, TensorType{x.dtype(), gathered}, d, weight_dt);
    Value y;
    for (size_t k = 0; k < t.idx.size(); ++k) {
      Value term = b.binary("multiply", take(b, x, t.idx[k], d), ws[k]);
      y = k == 0 ? term : b.binary("add", y, term);
    }
    if (integral) {
      auto [lo, hi] = integer_range(in_dt);
      y = b.unary("round_nearest_afz", y);
      y = b.binary("minimum", b.binary("maximum", y, splat_like(b, lo, y)), splat_like(b, hi, y));
    }
    x = y;
  }
  return {b.convert(x, out.dtype)};
}

std::vector<Value> upsample_backward(LoweringContext& ctx, Spec sp) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  check_dtype(ctx, sp, out.dtype, true);
  if (out.numel() == 0) return {b.zeros(out)};
  Value g = ctx.tensor("grad_output");
  bool align = sp.has_align && ctx.to_bool("align_corners", false);
  auto scales = scales_of(ctx, sp.nd);
  auto in_size = ctx.ints("input_size");
  DType dt = out.dtype;
  g = b.convert(g, math_dtype(dt));
  if (g.type.numel() == 0) return {b.zeros(out)};
  for (int i = 0; i < sp.nd; ++i) {
    int64_t d = g.rank() - sp.nd + i;
    int64_t n_in = in_size[in_size.size() - sp.nd + i];
    Taps t = taps_for(sp, dt, n_in, g.shape()[d], align, scales[i], true);
    if (antialiased(sp.kind)) {
      WideTaps wt = wide_taps(b, t, g.shape(), d, g.dtype(), g.dtype(), /*first_always=*/false);
      std::vector<int64_t> dims;
      for (int64_t j = 0; j < g.rank() + 1; ++j)
        if (j != d + 1) dims.push_back(j);
      Value spread = b.broadcast_in_dim(g, wt.split, dims);
      Value parts = b.select(wt.mask, b.binary("multiply", spread, wt.w), b.zeros(spread.type));
      Shape flat = g.shape();
      flat[d] = static_cast<int64_t>(wt.idx.size());
      g = scatter_add(b, b.reshape(parts, flat), wt.idx, d, n_in);
      continue;
    }
    std::vector<Value> parts;
    std::vector<int64_t> idx;
    auto ws = t.w.empty() ? std::vector<Value>{} : weights(b, t, g.type, d, g.dtype());
    for (size_t k = 0; k < t.idx.size(); ++k) {
      parts.push_back(ws.empty() ? g : b.binary("multiply", g, ws[k]));
      idx.insert(idx.end(), t.idx[k].begin(), t.idx[k].end());
    }
    g = scatter_add(b, parts.size() == 1 ? parts[0] : b.concatenate(parts, d), idx, d, n_in);
  }
  return {b.convert(g, dt)};
}

}  // namespace

#define TP_UPSAMPLE(name, kind, nd, align)                                                            \
  TORCH_PJRT_LOWERING(name, [](LoweringContext& c) { return upsample(c, Spec{kind, nd, align}); }); \
  TORCH_PJRT_LOWERING(name "_backward",                                                             \
                      [](LoweringContext& c) { return upsample_backward(c, Spec{kind, nd, align}); });

TP_UPSAMPLE("upsample_nearest1d", Kind::Nearest, 1, false)
TP_UPSAMPLE("upsample_nearest2d", Kind::Nearest, 2, false)
TP_UPSAMPLE("upsample_nearest3d", Kind::Nearest, 3, false)
TP_UPSAMPLE("_upsample_nearest_exact1d", Kind::NearestExact, 1, false)
TP_UPSAMPLE("_upsample_nearest_exact2d", Kind::NearestExact, 2, false)
TP_UPSAMPLE("_upsample_nearest_exact3d", Kind::NearestExact, 3, false)
TP_UPSAMPLE("upsample_linear1d", Kind::Linear, 1, true)
TP_UPSAMPLE("upsample_bilinear2d", Kind::Linear, 2, true)
TP_UPSAMPLE("upsample_trilinear3d", Kind::Linear, 3, true)
TP_UPSAMPLE("upsample_bicubic2d", Kind::Cubic, 2, true)
TP_UPSAMPLE("_upsample_bilinear2d_aa", Kind::LinearAA, 2, true)
TP_UPSAMPLE("_upsample_bicubic2d_aa", Kind::CubicAA, 2, true)

#undef TP_UPSAMPLE

}  // namespace torch_pjrt::lowering::ops
