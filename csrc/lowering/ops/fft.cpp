// torch.fft through stablehlo.fft: PyTorch's _fft_c2c, _fft_r2c and _fft_c2r
// over any subset of dims. The transformed dims go to the end (at most 3 per
// stablehlo.fft, as XLA allows; a c2c over more is done in groups), then back.
// XLA's inverse transforms divide by n; PyTorch's ATen ops are unnormalized
// and scale by `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n) themselves.
#include <algorithm>
#include <cmath>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::string lengths_attr(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

std::vector<int64_t> normalize_dims(const LoweringContext& ctx, std::vector<int64_t> dims, int64_t rank) {
  for (auto& d : dims) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) ctx.fail("fft: dim out of range");
  }
  return dims;
}

// One stablehlo.fft over `group` (<= 3 dims of x, the last one innermost):
// the group moved to the end, transformed, moved back. `lengths` are the fft
// lengths (the real signal's sizes for RFFT/IRFFT); `out` the element type;
// `last_out` the result's size along group.back().
Value fft_group(Builder& b, const Value& x, const std::vector<int64_t>& group, const char* type,
                const std::vector<int64_t>& lengths, DType out, int64_t last_out) {
  int64_t r = x.rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i)
    if (std::find(group.begin(), group.end(), i) == group.end()) perm.push_back(i);
  for (auto g : group) perm.push_back(g);
  Value xt = b.transpose(x, perm);
  Shape os = xt.shape();
  os.back() = last_out;
  Value y = b.op("stablehlo.fft", {xt}, TensorType{out, os},
                 std::string("fft_type = #stablehlo<fft_type ") + type + ">, fft_length = " + lengths_attr(lengths));
  std::vector<int64_t> inv(r);
  for (int64_t i = 0; i < r; ++i) inv[perm[i]] = i;
  return b.transpose(y, inv);
}

Value scale(Builder& b, const Value& x, double factor) {
  if (factor == 1.0) return x;
  return b.binary("multiply", x, b.splat(Scalar::from_float(factor), TensorType{x.dtype(), x.shape()}));
}

double norm_factor(int64_t normalization, double n) {
  if (normalization == 1) return 1.0 / std::sqrt(n);
  if (normalization == 2) return 1.0 / n;
  return 1.0;
}

// c2c over `dims` in groups of <= 3; unnormalized (inverse ones undo XLA's 1/n).
Value c2c(Builder& b, Value x, std::vector<int64_t> dims, bool forward) {
  while (!dims.empty()) {
    size_t k = std::min<size_t>(3, dims.size());
    std::vector<int64_t> group(dims.end() - k, dims.end());
    dims.resize(dims.size() - k);
    std::vector<int64_t> lengths;
    double n = 1;
    for (auto g : group) { lengths.push_back(x.shape()[g]); n *= double(x.shape()[g]); }
    if (n == 0) continue;
    x = fft_group(b, x, group, forward ? "FFT" : "IFFT", lengths, x.dtype(), x.shape()[group.back()]);
    if (!forward) x = scale(b, x, n);
  }
  return x;
}

std::vector<Value> fft_c2c(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  Value x = b.convert(ctx.tensor("self"), out);
  auto dims = normalize_dims(ctx, ctx.ints("dim"), x.rank());
  double n = 1;
  for (auto d : dims) n *= double(x.shape()[d]);
  if (x.type.numel() == 0) return {b.zeros(ctx.out())};
  Value y = c2c(b, x, dims, ctx.to_bool("forward", true));
  return {scale(b, y, norm_factor(ctx.to_int("normalization", 0), n))};
}

std::vector<Value> fft_r2c(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  Value x = b.convert(ctx.tensor("self"), real_dtype(out));
  auto dims = normalize_dims(ctx, ctx.ints("dim"), x.rank());
  if (x.type.numel() == 0 || dims.empty()) return {b.zeros(ctx.out())};
  double n = 1;
  for (auto d : dims) n *= double(x.shape()[d]);
  double f = norm_factor(ctx.to_int("normalization", 0), n);
  if (!ctx.to_bool("onesided", true)) return {scale(b, c2c(b, b.convert(x, out), dims, true), f)};
  size_t k = std::min<size_t>(3, dims.size());
  std::vector<int64_t> group(dims.end() - k, dims.end()), rest(dims.begin(), dims.end() - k);
  std::vector<int64_t> lengths;
  for (auto g : group) lengths.push_back(x.shape()[g]);
  Value y = fft_group(b, x, group, "RFFT", lengths, out, x.shape()[group.back()] / 2 + 1);
  return {scale(b, c2c(b, y, rest, true), f)};
}

std::vector<Value> fft_c2r(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& o = ctx.out();
  Value x = b.convert(ctx.tensor("self"), complex_dtype(o.dtype));
  auto dims = normalize_dims(ctx, ctx.ints("dim"), x.rank());
  if (o.numel() == 0 || dims.empty()) return {b.zeros(o)};
  int64_t last = ctx.to_int("last_dim_size", 0), half = last / 2 + 1, d = dims.back();
  // The last dim's first last/2+1 entries (zero-padded if fewer).
  if (x.shape()[d] > half) {
    Shape lo(x.rank(), 0), hi = x.shape();
    hi[d] = half;
    x = b.slice(x, lo, hi);
  } else if (x.shape()[d] < half) {
    Shape lo(x.rank(), 0), hi(x.rank(), 0);
    hi[d] = half - x.shape()[d];
    x = b.pad(x, b.zeros(TensorType{x.dtype(), {}}), lo, hi);
  }
  size_t k = std::min<size_t>(3, dims.size());
  std::vector<int64_t> group(dims.end() - k, dims.end()), rest(dims.begin(), dims.end() - k);
  x = c2c(b, x, rest, false);
  std::vector<int64_t> lengths;
  double gn = 1, n = 1;
  for (auto g : group) {
    int64_t len = g == d ? last : x.shape()[g];
    lengths.push_back(len);
    gn *= double(len);
  }
  for (auto dd : dims) n *= double(o.shape[dd]);
  Value y = fft_group(b, x, group, "IRFFT", lengths, o.dtype, last);
  return {scale(b, y, gn * norm_factor(ctx.to_int("normalization", 0), n))};
}

}  // namespace

TORCH_PJRT_LOWERING("_fft_c2c", fft_c2c);
TORCH_PJRT_LOWERING("_fft_r2c", fft_r2c);
TORCH_PJRT_LOWERING("_fft_c2r", fft_c2r);

}  // namespace torch_pjrt::lowering::ops
