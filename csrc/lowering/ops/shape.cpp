// Shape ops that move data: cat, flip, roll, index_select, gather, tril/triu.
// Pure views (view, permute, slice, expand ...) never get here: the executor
// reads them as strided accesses of their storage.
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

// PyTorch's legacy rule: 1-d empty tensors are ignored whatever the other shapes.
std::vector<Value> cat(LoweringContext& ctx) {
  const TensorType& out = ctx.out();
  std::vector<Value> parts;
  for (const Value& t : ctx.arg("tensors").tensors) {
    if (t.shape() == Shape{0} && out.rank() != 1) continue;
    if (t.type.numel() == 0) continue;  // contributes nothing along dim
    parts.push_back(ctx.b.convert(t, out.dtype));
  }
  if (parts.empty() || out.numel() == 0) return {ctx.b.zeros(out)};
  return {ctx.b.concatenate(parts, wrap_dim(ctx.to_int("dim", 0), out.rank()))};
}

std::vector<Value> flip(LoweringContext& ctx) {
  const Value& x = ctx.tensor("self");
  std::vector<int64_t> dims = ctx.ints("dims");
  if (x.rank() == 0 || dims.empty()) return {x};  // flip(dims=[]) is a no-op, not "all dims"
  return {ctx.b.reverse(x, wrap_dims(dims, x.rank()))};
}

// Rotation by `shift` along `dim`: the last `shift` entries move to the front.
Value roll_dim(Builder& b, const Value& x, int64_t shift, int64_t dim) {
  int64_t n = x.shape()[dim];
  if (n == 0) return x;
  int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  Shape lo(x.rank(), 0), hi = x.shape();
  Shape mid = lo;
  mid[dim] = n - s;
  Shape mid_hi = hi;
  mid_hi[dim] = n - s;
  return b.concatenate({b.slice(x, mid, hi), b.slice(x, lo, mid_hi)}, dim);
}

std::vector<Value> roll(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  std::vector<int64_t> shifts = ctx.ints("shifts"), dims = ctx.ints("dims");
  if (dims.empty()) {  // roll the flattened tensor
    Value flat = b.reshape(x, {x.type.numel()});
    return {b.reshape(roll_dim(b, flat, shifts.at(0), 0), x.shape())};
  }
  if (shifts.size() != dims.size()) ctx.fail("shifts and dims must have the same length");
  for (size_t i = 0; i < dims.size(); ++i)
    x = roll_dim(b, x, shifts[i], wrap_dim(dims[i], x.rank()));
  return {x};
}

std::vector<Value> index_select(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  // PyTorch's Meta kernel leaves these checks to the device kernel.
  const Value& index = ctx.tensor("index");
  if (index.rank() > 1) ctx.fail("index_select(): Index is supposed to be a vector");
  if (index.dtype() != DType::I64 && index.dtype() != DType::I32)
    ctx.fail("index_select(): Expected dtype int32 or int64 for index");
  if (out.numel() == 0) return {b.zeros(out)};
  if (x.rank() == 0) return {x};
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), x.rank());
  Value idx = b.reshape(ctx.tensor("index"), {ctx.tensor("index").type.numel()});
  std::vector<int64_t> bdims{dim};
  Value full = b.broadcast_in_dim(idx, out.shape, bdims);
  return {gather_along(b, x, full, dim)};
}

std::vector<Value> gather(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  if (x.rank() == 0) return {x};
  Value idx = b.reshape(ctx.tensor("index"), out.shape);
  return {gather_along(b, x, idx, wrap_dim(ctx.to_int("dim", 0), x.rank()))};
}

// Keeps entries whose column - row compares with `diagonal` as `keep` says.
std::vector<Value> triangle(LoweringContext& ctx, Cmp keep) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  if (x.rank() < 2) ctx.fail("input tensor must have at least 2 dimensions");
  int64_t r = x.rank();
  TensorType mt{DType::I64, {x.shape()[r - 2], x.shape()[r - 1]}};
  Value diff = b.binary("subtract", b.iota(mt, 1), b.iota(mt, 0));
  Value mask = b.compare(keep, diff, b.splat(Scalar::from_int(ctx.to_int("diagonal", 0)), mt));
  mask = b.broadcast_to(mask, x.shape());
  return {b.select(mask, x, b.zeros(x.type))};
}

}  // namespace

TORCH_PJRT_LOWERING("cat", cat);
TORCH_PJRT_LOWERING("flip", flip);
TORCH_PJRT_LOWERING("roll", roll);
TORCH_PJRT_LOWERING("index_select", index_select);
TORCH_PJRT_LOWERING("gather", gather);
TORCH_PJRT_LOWERING("tril", [](LoweringContext& c) { return triangle(c, Cmp::LE); });
TORCH_PJRT_LOWERING("triu", [](LoweringContext& c) { return triangle(c, Cmp::GE); });

}  // namespace torch_pjrt::lowering::ops
