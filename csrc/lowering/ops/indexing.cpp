// Indexing along one dimension: index_select and gather. Index ranges are
// checked in the program (ctx.check_indices, reported at the next host read),
// since XLA's gather itself clamps them.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// x gathered along `dim` with `idx` (any int dtype, the output's shape): out[p] =
// x[p with p[dim] replaced by idx[p]]. The other coordinates come from iotas.
Value gather_along(Builder& b, const Value& x, const Value& idx, int64_t dim) {
  Shape coord_shape = idx.shape();
  coord_shape.push_back(1);
  TensorType it{DType::I64, idx.shape()};
  std::vector<Value> coords;
  for (int64_t d = 0; d < x.rank(); ++d) {
    Value c = d == dim ? b.convert(idx, DType::I64) : b.iota(it, d);
    coords.push_back(b.reshape(c, coord_shape));
  }
  return b.gather_elements(x, b.concatenate(coords, x.rank()));
}

std::vector<Value> index_select(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  // PyTorch's Meta kernel leaves these checks to the device kernel.
  const Value& index = ctx.tensor("index");
  if (index.rank() > 1) ctx.index_error("index_select(): Index is supposed to be a vector");
  if (index.dtype() != DType::I64 && index.dtype() != DType::I32)
    ctx.fail("index_select(): Expected dtype int32 or int64 for index");
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  Value idx = b.reshape(index, {index.type.numel()});  // a 0-d index selects one entry
  if (x.rank() == 0) {  // CPU: one index, which must be 0
    if (index.type.numel() != 1)
      ctx.fail("index_select(): Index to scalar can have only 1 value, got " + std::to_string(index.type.numel()) +
               " value(s)");
    ctx.check_indices(idx, 0, 1, "index_select(): index out of range in self");
    return {x};
  }
  if (out.numel() == 0) {
    // An empty result still checks its indices on CPU (another path of its
    // kernel: another message, a RuntimeError).
    if (index.type.numel() > 0)
      ctx.check_indices(idx, 0, x.shape()[dim], "index_select(): INDICES element is out of DATA bounds",
                        LoweringContext::CheckError::Runtime);
    return {b.zeros(out)};
  }
  // Every index is out of range of an empty dim (XLA rejects the gather).
  if (x.shape()[dim] == 0) ctx.index_error("index_select(): index out of range in self");
  ctx.check_indices(idx, 0, x.shape()[dim], "index_select(): index out of range in self");
  return {gather_along(b, x, b.broadcast_in_dim(idx, out.shape, {dim}), dim)};
}

std::vector<Value> gather(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  int64_t size = x.rank() == 0 ? 1 : x.shape()[dim];  // a 0-d self has one entry, index 0
  std::string range = "gather(): index out of bounds for dimension " + std::to_string(dim) + " with size " +
                      std::to_string(size);
  // Every index is out of range of an empty dim (XLA rejects the gather).
  if (size == 0) ctx.fail(range);
  Value idx = b.reshape(ctx.tensor("index"), out.shape);
  ctx.check_indices(idx, 0, size, range, LoweringContext::CheckError::Runtime);
  if (x.rank() == 0) return {b.broadcast_to(x, out.shape)};
  return {gather_along(b, x, idx, dim)};
}

}  // namespace

TORCH_PJRT_LOWERING("index_select", index_select);
TORCH_PJRT_LOWERING("gather", gather);

}  // namespace torch_pjrt::lowering::ops
