// The pieces of nn.MultiheadAttention's and nn.TransformerEncoderLayer's
// inference fast path (device/transformer_kernels.cpp runs PyTorch's
// composition of them on tpu): the q/k/v split and the masked softmax.
// float16/bfloat16 are computed in float32 and rounded once, as CPU's kernels.
#include <cmath>
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// _transform_bias_rescale_qkv(qkv [B, T, 3D], qkv_bias [3D], num_heads) ->
// q, k, v as [B, H, T, D/H]: bias added, q scaled by 1/sqrt(D/H).
std::vector<Value> transform_bias_rescale_qkv(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value qkv = ctx.tensor("qkv");
  Value bias = ctx.tensor("qkv_bias");
  int64_t heads = ctx.to_int("num_heads", 1);
  if (qkv.rank() != 3 || bias.rank() != 1 || qkv.shape()[2] % 3 != 0 || bias.shape()[0] != qkv.shape()[2])
    ctx.fail("expected qkv of shape [B, T, 3 * D] and qkv_bias of shape [3 * D]");
  int64_t B = qkv.shape()[0], T = qkv.shape()[1], D = qkv.shape()[2] / 3;
  if (heads <= 0 || D % heads != 0) ctx.fail("D must be divisible by num_heads");
  int64_t dh = D / heads;
  DType out = ctx.out(0).dtype, acc = math_dtype(out);
  Value x = b.binary("add", b.convert(qkv, acc), b.broadcast_to(b.convert(bias, acc), qkv.shape()));
  // [B, T, 3, H, dh] -> [3, B, H, T, dh]
  x = b.transpose(b.reshape(x, {B, T, 3, heads, dh}), {2, 0, 3, 1, 4});
  std::vector<Value> res;
  for (int64_t i = 0; i < 3; ++i) {
    Value part = b.reshape(b.slice(x, {i, 0, 0, 0, 0}, {i + 1, B, heads, T, dh}), {B, heads, T, dh});
    if (i == 0) part = b.binary("multiply", part, splat_like(b, 1.0 / std::sqrt(static_cast<double>(dh)), part));
    res.push_back(b.convert(part, out));
  }
  return res;
}

// _masked_softmax(self, mask, dim, mask_type): softmax with masked (true)
// positions left out; a row with every position masked is NaN, as on CPU.
// mask_type 1 is a key padding mask [B, L] of a [B, H, L, L] input; others
// broadcast to the input.
std::vector<Value> masked_softmax(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  Value mask = ctx.tensor("mask");
  if (mask.dtype() != DType::Bool) ctx.fail("Mask should be a boolean tensor");
  int64_t rank = x.rank();
  int64_t dim = ctx.has("dim") ? wrap_dim(ctx.to_int("dim", -1), rank) : rank - 1;
  int64_t mask_type = ctx.has("mask_type") ? ctx.to_int("mask_type", 2) : 2;
  if (mask_type == 1 && rank == 4 && mask.rank() == 2)
    mask = b.reshape(mask, {mask.shape()[0], 1, 1, mask.shape()[1]});
  mask = b.broadcast_to(mask, x.shape());
  DType acc = math_dtype(x.dtype());
  Value v = b.convert(x, acc);
  double inf = std::numeric_limits<double>::infinity();
  v = b.select(mask, splat_like(b, -inf, v), v);
  return {b.convert(softmax_along(b, v, dim), ctx.out().dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("_transform_bias_rescale_qkv", transform_bias_rescale_qkv);
TORCH_PJRT_LOWERING("_masked_softmax", masked_softmax);

}  // namespace torch_pjrt::lowering::ops
