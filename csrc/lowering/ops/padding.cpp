// Padding: constant_pad_nd, reflection_pad{1,2,3}d and replication_pad{1,2,3}d
// with their backward ops. F.pad's "circular" mode is composite in PyTorch
// (narrow + cat) and needs nothing here.
//
// `padding` lists (low, high) pairs starting from the LAST dim. Negative
// amounts crop. Reflection and replication are separable, so each padded dim
// is handled on its own: the edge parts are built from slices of the original
// dim (which is what PyTorch indexes, even where that dim is also cropped),
// concatenated, then cropped. The backward ops apply the adjoint of the same
// steps. The Meta kernels have already checked ranks and pad sizes.
#include <algorithm>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

enum class Mode { Reflect, Replicate };

Value slice_dim(Builder& b, const Value& x, int64_t d, int64_t start, int64_t limit) {
  Shape lo(x.rank(), 0), hi = x.shape();
  lo[d] = start;
  hi[d] = limit;
  return b.slice(x, lo, hi);
}

// Zero padding of `low`/`high` elements along dim `d` (negative crops).
Value zero_pad_dim(Builder& b, const Value& x, int64_t d, int64_t low, int64_t high) {
  if (low == 0 && high == 0) return x;
  Shape lo(x.rank(), 0), hi(x.rank(), 0);
  lo[d] = low;
  hi[d] = high;
  return b.pad(x, b.constant(0.0, x.dtype()), lo, hi);
}

// A size-1 dim `d` of `x` repeated `size` times.
Value with_dim(Builder& b, const Value& x, int64_t d, int64_t size) {
  Shape s = x.shape();
  s[d] = size;
  std::vector<int64_t> dims(x.rank());
  for (int64_t i = 0; i < x.rank(); ++i) dims[i] = i;
  return b.broadcast_in_dim(x, s, dims);
}

Value pad_dim(Builder& b, const Value& x, int64_t d, int64_t l, int64_t r, Mode mode) {
  int64_t n = x.shape()[d], L = std::max<int64_t>(l, 0), R = std::max<int64_t>(r, 0);
  std::vector<Value> parts;
  if (mode == Mode::Reflect) {
    if (L > 0) parts.push_back(b.reverse(slice_dim(b, x, d, 1, 1 + L), {d}));
    parts.push_back(x);
    if (R > 0) parts.push_back(b.reverse(slice_dim(b, x, d, n - 1 - R, n - 1), {d}));
  } else {
    if (L > 0) parts.push_back(with_dim(b, slice_dim(b, x, d, 0, 1), d, L));
    parts.push_back(x);
    if (R > 0) parts.push_back(with_dim(b, slice_dim(b, x, d, n - 1, n), d, R));
  }
  Value y = parts.size() == 1 ? x : b.concatenate(parts, d);
  int64_t crop_l = std::max<int64_t>(-l, 0), crop_r = std::max<int64_t>(-r, 0);
  if (crop_l == 0 && crop_r == 0) return y;
  return slice_dim(b, y, d, crop_l, y.shape()[d] - crop_r);
}

// The adjoint of pad_dim: `g` is the gradient of the padded dim, `n` the input's size.
Value pad_dim_backward(Builder& b, Value g, int64_t d, int64_t n, int64_t l, int64_t r, Mode mode) {
  int64_t L = std::max<int64_t>(l, 0), R = std::max<int64_t>(r, 0);
  g = zero_pad_dim(b, g, d, std::max<int64_t>(-l, 0), std::max<int64_t>(-r, 0));
  Value grad = slice_dim(b, g, d, L, L + n);
  auto add = [&](const Value& v) { grad = b.binary("add", grad, v); };
  if (mode == Mode::Reflect) {
    if (L > 0) add(zero_pad_dim(b, b.reverse(slice_dim(b, g, d, 0, L), {d}), d, 1, n - 1 - L));
    if (R > 0) add(zero_pad_dim(b, b.reverse(slice_dim(b, g, d, L + n, L + n + R), {d}), d, n - 1 - R, 1));
  } else {
    auto edge_sum = [&](int64_t start, int64_t limit) {
      Value s = b.reduce(slice_dim(b, g, d, start, limit), b.constant(0.0, g.dtype()), {d}, "stablehlo.add");
      Shape one = g.shape();
      one[d] = 1;
      return b.reshape(s, one);
    };
    if (L > 0) add(zero_pad_dim(b, edge_sum(0, L), d, 0, n - 1));
    if (R > 0) add(zero_pad_dim(b, edge_sum(L + n, L + n + R), d, n - 1, 0));
  }
  return grad;
}

// The Meta kernels accept inputs with too many dims (e.g. 5-D for reflection_pad2d); CPU raises.
void check_rank(const LoweringContext& ctx, const Value& x, size_t npad) {
  int64_t n = int64_t(npad / 2);
  if (x.rank() != n + 1 && x.rank() != n + 2)
    ctx.fail("Expected " + std::to_string(n + 1) + "D or " + std::to_string(n + 2) +
             "D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, "
             "but got a " + std::to_string(x.rank()) + "D tensor");
}

std::vector<Value> pad_forward(LoweringContext& ctx, Mode mode) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  auto p = ctx.ints("padding");
  check_rank(ctx, x, p.size());
  if (ctx.out().numel() == 0) return {b.zeros(ctx.out())};
  for (size_t i = 0; i + 1 < p.size(); i += 2)
    x = pad_dim(b, x, x.rank() - 1 - int64_t(i / 2), p[i], p[i + 1], mode);
  return {x};
}

std::vector<Value> pad_backward(LoweringContext& ctx, Mode mode) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  auto p = ctx.ints("padding");
  check_rank(ctx, self, p.size());
  if (ctx.out().numel() == 0) return {b.zeros(ctx.out())};
  // Half types accumulate in float32 and round once.
  Value g = b.convert(ctx.tensor("grad_output"), math_dtype(ctx.out().dtype));
  if (ctx.tensor("grad_output").type.numel() == 0) return {b.zeros(ctx.out())};
  for (size_t i = 0; i + 1 < p.size(); i += 2) {
    int64_t d = g.rank() - 1 - int64_t(i / 2);
    g = pad_dim_backward(b, g, d, self.shape()[d], p[i], p[i + 1], mode);
  }
  return {b.convert(g, ctx.out().dtype)};
}

// constant_pad_nd: one stablehlo.pad (negative amounts crop).
std::vector<Value> constant_pad(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  Value value = ctx.operand("value", out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  // Every output element is padding when the input is empty.
  if (x.type.numel() == 0) return {b.broadcast_in_dim(value, out.shape, {})};
  auto p = ctx.ints("pad");
  Shape lo(x.rank(), 0), hi(x.rank(), 0);
  for (size_t i = 0; i + 1 < p.size(); i += 2) {
    int64_t d = x.rank() - 1 - int64_t(i / 2);
    lo[d] = p[i];
    hi[d] = p[i + 1];
  }
  return {b.pad(b.convert(x, out.dtype), value, lo, hi)};
}

}  // namespace

TORCH_PJRT_LOWERING("constant_pad_nd", constant_pad);
TORCH_PJRT_LOWERING("reflection_pad1d", [](LoweringContext& c) { return pad_forward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("reflection_pad2d", [](LoweringContext& c) { return pad_forward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("reflection_pad3d", [](LoweringContext& c) { return pad_forward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("replication_pad1d", [](LoweringContext& c) { return pad_forward(c, Mode::Replicate); });
TORCH_PJRT_LOWERING("replication_pad2d", [](LoweringContext& c) { return pad_forward(c, Mode::Replicate); });
TORCH_PJRT_LOWERING("replication_pad3d", [](LoweringContext& c) { return pad_forward(c, Mode::Replicate); });
TORCH_PJRT_LOWERING("reflection_pad1d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("reflection_pad2d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("reflection_pad3d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Reflect); });
TORCH_PJRT_LOWERING("replication_pad1d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Replicate); });
TORCH_PJRT_LOWERING("replication_pad2d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Replicate); });
TORCH_PJRT_LOWERING("replication_pad3d_backward", [](LoweringContext& c) { return pad_backward(c, Mode::Replicate); });

}  // namespace torch_pjrt::lowering::ops
