// Shape ops that move data: cat, flip, roll, tril/triu, channel_shuffle, and
// the index lists tril_indices/triu_indices.
// Pure views (view, permute, slice, expand ...) never get here: the executor
// reads them as strided accesses of their storage.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> cat(LoweringContext& ctx) {
  const TensorType& out = ctx.out();
  std::vector<Value> parts;
  for (const Value& t : ctx.arg("tensors").tensors) {
    // Empty inputs add nothing; this also drops the 1-d (0,) tensors that
    // PyTorch's legacy rule accepts whatever the other shapes are.
    if (t.type.numel() == 0) continue;
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
  Shape zero(x.rank(), 0), split = zero, end = x.shape(), split_end = end;
  split[dim] = split_end[dim] = n - s;
  return b.concatenate({b.slice(x, split, end), b.slice(x, zero, split_end)}, dim);
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

// channel_shuffle(self [N, C, *], groups): channel g * (C / groups) + k moves
// to k * groups + g, a reshape, a transpose and a reshape.
std::vector<Value> channel_shuffle(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  int64_t groups = ctx.to_int("groups", 1);
  if (x.rank() <= 2)
    ctx.fail("channel_shuffle expects input to have at least 3 dimensions, but got input with " +
             std::to_string(x.rank()) + " dimensions");
  if (groups <= 0)
    ctx.fail("Number of groups to divide channels in must be positive. Value of groups:" + std::to_string(groups));
  int64_t c = x.shape()[1];
  if (c % groups != 0)
    ctx.fail("Number of channels must be divisible by groups. Got " + std::to_string(c) + " channels and " +
             std::to_string(groups) + " groups.");
  if (x.type.numel() == 0) return {b.zeros(ctx.out())};
  Shape split = x.shape();
  split[1] = c / groups;
  split.insert(split.begin() + 1, groups);
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < int64_t(split.size()); ++d) perm.push_back(d);
  std::swap(perm[1], perm[2]);
  return {b.reshape(b.transpose(b.reshape(x, split), perm), ctx.out().shape)};
}

// tril_indices/triu_indices(row, col, offset): the [2, N] coordinates of the
// kept elements of a row x col matrix in row-major order. Each kept element's
// place is the count of kept elements before it (a scan of the mask), and
// its row and column are scattered there.
std::vector<Value> triangle_indices(LoweringContext& ctx, Cmp keep) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  int64_t rows = ctx.to_int("row", 0), cols = ctx.to_int("col", 0), n = out.shape[1];
  if (n == 0) return {b.zeros(out)};
  int64_t cells = rows * cols;
  TensorType mt{DType::I64, {rows, cols}};
  Value diff = b.binary("subtract", b.iota(mt, 1), b.iota(mt, 0));
  Value mask = b.reshape(b.compare(keep, diff, b.splat(Scalar::from_int(ctx.to_int("offset", 0)), mt)), {cells});
  TensorType flat{DType::I64, {cells}};
  Value place = inclusive_scan(b, b.convert(mask, DType::I64), 0, 0.0,
                               [](Builder& b, const Value& x, const Value& y) { return b.binary("add", x, y); });
  place = b.select(mask, b.binary("subtract", place, b.splat(Scalar::from_int(1), flat)),
                   b.splat(Scalar::from_int(n), flat));  // (dropped by the scatter)
  auto spread = [&](int64_t dim) {
    Value v = b.reshape(b.iota(mt, dim), {cells});
    return b.scatter_elements(b.zeros({DType::I64, {n}}), b.reshape(place, {cells, 1}), v);
  };
  Value both = b.concatenate({b.reshape(spread(0), {1, n}), b.reshape(spread(1), {1, n})}, 0);
  return {b.convert(both, out.dtype)};
}

// unfold_backward(grad_in, input_sizes, dim, size, step): the gradient of
// x.unfold(dim, size, step). Window w's element k came from x[.. w*step+k ..]:
// scatter-add every grad element there (overlapping windows add up).
std::vector<Value> unfold_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& g = ctx.tensor("grad_in");
  const TensorType& out = ctx.out();
  if (out.numel() == 0 || g.type.numel() == 0) return {b.zeros(out)};
  int64_t r = out.rank();
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), r), step = ctx.to_int("step", 1);
  TensorType it{DType::I64, g.shape()};
  Shape coord_shape = g.shape();
  coord_shape.push_back(1);
  std::vector<Value> coords;
  for (int64_t d = 0; d < std::max<int64_t>(r, 1); ++d) {
    Value c = b.iota(it, d);
    if (d == dim)
      c = b.binary("add", b.binary("multiply", c, b.splat(Scalar::from_int(step), it)), b.iota(it, g.rank() - 1));
    coords.push_back(b.reshape(c, coord_shape));
  }
  Value target = r == 0 ? b.reshape(b.zeros(out), {1}) : b.zeros(out);
  Value res = b.scatter_elements(target, b.concatenate(coords, g.rank()), b.convert(g, out.dtype), "stablehlo.add");
  return {b.reshape(res, out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("unfold_backward", unfold_backward);
TORCH_PJRT_LOWERING("cat", cat);
TORCH_PJRT_LOWERING("flip", flip);
TORCH_PJRT_LOWERING("roll", roll);
TORCH_PJRT_LOWERING("tril", [](LoweringContext& c) { return triangle(c, Cmp::LE); });
TORCH_PJRT_LOWERING("channel_shuffle", channel_shuffle);
TORCH_PJRT_LOWERING("tril_indices", [](LoweringContext& c) { return triangle_indices(c, Cmp::LE); });
TORCH_PJRT_LOWERING("triu_indices", [](LoweringContext& c) { return triangle_indices(c, Cmp::GE); });
TORCH_PJRT_LOWERING("triu", [](LoweringContext& c) { return triangle(c, Cmp::GE); });

}  // namespace torch_pjrt::lowering::ops
