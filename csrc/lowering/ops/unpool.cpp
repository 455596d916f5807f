// max_unpool2d/max_unpool3d: each input element written to the place its
// index names in its (batch, channel) plane of the output, zeros elsewhere.
// Indices are checked on the device (CPU's "invalid max index" error at the
// next host read). Duplicate indices: the last write wins, as CPU's loop.
// (The gradient is max_pool_double_backward, a gather PyTorch composes.)
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> max_unpool(LoweringContext& ctx, int64_t dims) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const Value& indices = ctx.tensor("indices");
  const TensorType& out = ctx.out();
  std::string name = "max_unpooling" + std::to_string(dims) + "d";
  if (indices.dtype() != DType::I64)
    ctx.fail(std::string("elements in indices should be type int64 but got: ") + dtype_name(indices.dtype()));
  if (x.rank() != dims + 1 && x.rank() != dims + 2)
    ctx.fail("Input to " + name + " should be a " + std::to_string(dims + 1) + "d or " + std::to_string(dims + 2) +
             "d Tensor, but got a tensor with " + std::to_string(x.rank()) + " dimensions.");
  if (x.shape() != indices.shape())
    ctx.fail("Expected shape of indices to be same as that of the input tensor");
  if (out.numel() == 0) return {b.zeros(out)};
  int64_t planes = 1, in_size = 1, out_size = 1;
  for (int64_t d = 0; d < x.rank() - dims; ++d) planes *= x.shape()[d];
  for (int64_t d = x.rank() - dims; d < x.rank(); ++d) in_size *= x.shape()[d];
  for (int64_t d = out.shape.size() - dims; d < int64_t(out.shape.size()); ++d) out_size *= out.shape[d];
  std::string sizes;
  for (int64_t d = out.shape.size() - dims; d < int64_t(out.shape.size()); ++d)
    sizes += (sizes.empty() ? "" : "x") + std::to_string(out.shape[d]);
  Value idx = b.reshape(indices, {planes, in_size});
  ctx.check_indices(idx, 0, out_size, "Found an invalid max index (output volumes are of size " + sizes + ")",
                    LoweringContext::CheckError::Runtime);
  if (in_size == 0) return {b.zeros(out)};
  TensorType it{DType::I64, {planes, in_size}};
  Value at = b.concatenate({b.reshape(b.iota(it, 0), {planes, in_size, 1}), b.reshape(idx, {planes, in_size, 1})}, 2);
  Value r = b.scatter_elements(b.zeros({out.dtype, {planes, out_size}}), at, b.reshape(x, {planes, in_size}));
  return {b.reshape(r, out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("max_unpool2d", [](LoweringContext& c) { return max_unpool(c, 2); });
TORCH_PJRT_LOWERING("max_unpool3d", [](LoweringContext& c) { return max_unpool(c, 3); });

}  // namespace torch_pjrt::lowering::ops
