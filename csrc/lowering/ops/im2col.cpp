// im2col (nn.Unfold) and col2im (nn.Fold, and im2col's backward). Each kernel
// offset (i, j) is one strided slice of the zero-padded image: exact, with no
// multiply (a one-hot convolution would turn an inf beside the window into
// NaN). col2im pads each offset's columns back in place (interior padding for
// the stride) and sums them, in float32 for half types.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct Geometry {
  int64_t k0, k1, d0, d1, p0, p1, s0, s1;
  int64_t blocks(int64_t padded, int d) const {  // output positions along dim d (0: rows)
    int64_t k = d == 0 ? k0 : k1, dil = d == 0 ? d0 : d1, s = d == 0 ? s0 : s1;
    return (padded - (dil * (k - 1) + 1)) / s + 1;
  }
};

Geometry geometry(const LoweringContext& ctx) {
  auto k = ctx.ints("kernel_size"), d = ctx.ints("dilation"), p = ctx.ints("padding"), s = ctx.ints("stride");
  return {k[0], k[1], d[0], d[1], p[0], p[1], s[0], s[1]};
}

std::vector<Value> im2col(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  if (x.rank() == 3) x = b.reshape(x, {1, x.shape()[0], x.shape()[1], x.shape()[2]});
  Geometry g = geometry(ctx);
  int64_t n = x.shape()[0], c = x.shape()[1];
  Value xp = b.pad(x, b.constant(0.0, x.dtype()), {0, 0, g.p0, g.p1}, {0, 0, g.p0, g.p1});
  int64_t oh = g.blocks(xp.shape()[2], 0), ow = g.blocks(xp.shape()[3], 1);
  std::vector<Value> parts;
  for (int64_t i = 0; i < g.k0; ++i)
    for (int64_t j = 0; j < g.k1; ++j) {
      Value part = b.slice(xp, {0, 0, i * g.d0, j * g.d1},
                           {n, c, i * g.d0 + g.s0 * (oh - 1) + 1, j * g.d1 + g.s1 * (ow - 1) + 1}, {1, 1, g.s0, g.s1});
      parts.push_back(b.reshape(part, {n, c, 1, oh * ow}));
    }
  Value cols = parts.size() == 1 ? parts[0] : b.concatenate(parts, 2);  // [n, c, k0 * k1, L]
  return {b.reshape(cols, ctx.out().shape)};
}

std::vector<Value> col2im(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = math_dtype(out.dtype);
  Value x = b.convert(ctx.tensor("self"), dt);
  if (x.rank() == 2) x = b.reshape(x, {1, x.shape()[0], x.shape()[1]});
  Geometry g = geometry(ctx);
  auto size = ctx.ints("output_size");
  int64_t n = x.shape()[0], kk = g.k0 * g.k1, c = x.shape()[1] / kk;
  int64_t hp = size[0] + 2 * g.p0, wp = size[1] + 2 * g.p1;
  int64_t oh = g.blocks(hp, 0), ow = g.blocks(wp, 1);
  Value cols = b.reshape(x, {n, c, kk, oh, ow});
  Value zero = b.constant(0.0, dt);
  Value acc = b.zeros({dt, {n, c, hp, wp}});
  for (int64_t i = 0; i < g.k0; ++i)
    for (int64_t j = 0; j < g.k1; ++j) {
      int64_t k = i * g.k1 + j;
      Value part = b.reshape(b.slice(cols, {0, 0, k, 0, 0}, {n, c, k + 1, oh, ow}), {n, c, oh, ow});
      int64_t top = i * g.d0, left = j * g.d1;
      Value placed = b.pad(part, zero, {0, 0, top, left},
                           {0, 0, hp - (top + g.s0 * (oh - 1) + 1), wp - (left + g.s1 * (ow - 1) + 1)},
                           {0, 0, g.s0 - 1, g.s1 - 1});
      acc = b.binary("add", acc, placed);
    }
  Value image = b.slice(acc, {0, 0, g.p0, g.p1}, {n, c, g.p0 + size[0], g.p1 + size[1]});
  return {b.convert(b.reshape(image, out.shape), out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("im2col", im2col);
TORCH_PJRT_LOWERING("col2im", col2im);

}  // namespace torch_pjrt::lowering::ops
