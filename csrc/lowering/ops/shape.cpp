// Shape ops that move data: cat, flip, roll, tril/triu, channel_shuffle, and
// the index lists tril_indices/triu_indices and nonzero_static.
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
  // (diagonal through operand: a compiled graph may pass it at run time, a
  // causal mask's triu(..., diagonal=start + 1) for a decode position.)
  Value d = ctx.has("diagonal") ? b.broadcast_to(ctx.operand("diagonal", DType::I64), mt.shape)
                                : b.splat(Scalar::from_int(0), mt);
  Value mask = b.compare(keep, diff, d);
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

// The rows of `values` [m, k] whose `keep` [m] is true, in order, in the first
// rows of an [n, k] result filled with `fill`: each kept row's place is the
// count of kept rows before it (a scan), and it is scattered there (places
// past n are dropped).
Value compact_rows(Builder& b, const Value& keep, const Value& values, int64_t n, const Value& fill) {
  int64_t m = values.shape()[0], k = values.shape()[1];
  TensorType it{DType::I64, {m}};
  Value place = prefix_sum(b, b.convert(keep, DType::I64), 0);
  place = b.select(keep, b.binary("subtract", place, b.splat(Scalar::from_int(1), it)), b.splat(Scalar::from_int(n), it));
  Value target = b.broadcast_to(b.reshape(fill, {}), {n, k});
  return b.op_multi("stablehlo.scatter", {target, b.reshape(place, {m, 1}), values}, {target.type},
                    "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
                    "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
                    "indices_are_sorted = true, unique_indices = false",
                    b.scatter_region(values.dtype(), ""))[0];
}

// The coordinates [numel, rank] of every element of a shape, row-major.
Value coordinates(Builder& b, const Shape& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<Value> cols;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d)
    cols.push_back(b.reshape(b.iota({DType::I64, shape}, d), {numel, 1}));
  return cols.empty() ? b.zeros({DType::I64, {numel, 0}}) : b.concatenate(cols, 1);
}

// tril_indices/triu_indices(row, col, offset): the [2, N] coordinates of the
// kept elements of a row x col matrix in row-major order.
std::vector<Value> triangle_indices(LoweringContext& ctx, Cmp keep) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  int64_t rows = ctx.to_int("row", 0), cols = ctx.to_int("col", 0), n = out.shape[1];
  if (n == 0) return {b.zeros(out)};
  TensorType mt{DType::I64, {rows, cols}};
  Value diff = b.binary("subtract", b.iota(mt, 1), b.iota(mt, 0));
  Value mask = b.reshape(b.compare(keep, diff, b.splat(Scalar::from_int(ctx.to_int("offset", 0)), mt)), {rows * cols});
  Value at = compact_rows(b, mask, coordinates(b, {rows, cols}), n, b.constant_int(0, DType::I64));
  return {b.convert(b.transpose(at, {1, 0}), out.dtype)};
}

// nonzero_static(self, size, fill_value): the first `size` coordinates of
// non-zero elements (row-major), the rest fill_value: nonzero with a static
// shape, as code written for XLA uses it.
std::vector<Value> nonzero_static(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& x = ctx.tensor("self");
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  Value fill = b.constant_int(ctx.to_int("fill_value", -1), DType::I64);
  if (x.type.numel() == 0) return {b.convert(b.broadcast_to(fill, out.shape), out.dtype)};
  int64_t numel = x.type.numel();
  Value flat = b.reshape(x, {numel});
  Value nonzero;
  if (x.dtype() == DType::Bool) {
    nonzero = flat;
  } else if (is_float(x.dtype())) {  // bits past the sign: XLA's CPU backend compares subnormals as 0
    DType it = x.dtype() == DType::F64 ? DType::I64 : x.dtype() == DType::F32 ? DType::I32 : DType::I16;
    TensorType bt{it, {numel}};
    Value bits = b.op("stablehlo.shift_left", {b.bitcast_convert(flat, bt), b.splat(Scalar::from_int(1), bt)}, bt);
    nonzero = b.compare(Cmp::NE, bits, b.zeros(bt));
  } else {
    nonzero = b.compare(Cmp::NE, flat, b.zeros(flat.type));
  }
  Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
  Value at = compact_rows(b, nonzero, coordinates(b, shape), out.shape[0], fill);
  return {b.convert(b.reshape(at, out.shape), out.dtype)};
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
TORCH_PJRT_LOWERING("nonzero_static", nonzero_static);
TORCH_PJRT_LOWERING("triu", [](LoweringContext& c) { return triangle(c, Cmp::GE); });

}  // namespace torch_pjrt::lowering::ops
