// EmbeddingBag: bags of embedding rows reduced by sum, mean or max
// (_embedding_bag, _embedding_bag_forward_only), and its gradients
// (_embedding_bag_backward, _embedding_bag_dense_backward,
// _embedding_bag_per_sample_weights_backward). Indices and offsets stay on the
// device: every shape depends on sizes only.
//
// Bags are segments of the 1-d indices: bag b is [offsets[b], offsets[b+1])
// and the last one runs to the end (include_last_offset only stops the last
// offset from starting a bag). That is CPU's offset2bag: the number of bag
// starts at or before each index, less one. Entries equal to padding_idx are
// left out and not counted. The secondary outputs have the shapes PyTorch's
// Meta kernel gives a non-CPU device (CUDA's: offset2bag per index, bag_size
// per offset, max_indices [bags, D] in max mode and empty otherwise); only the
// backward here reads them.
#include <cmath>

#include "lowering/ops/embedding.h"

namespace torch_pjrt::lowering::ops {
namespace {

constexpr int64_t kMean = 1, kMax = 2;
constexpr const char* kNoSparse =
    "sparse tensors are not supported on device tpu: nn.EmbeddingBag(sparse=True) makes one for the "
    "weight's gradient; use sparse=False (a dense gradient) on tpu.";  // (eager raises it before: aten_kernels.cpp)

Value full_i64(Builder& b, int64_t v, const Shape& shape) {
  return b.splat(Scalar::from_int(v), TensorType{DType::I64, shape});
}

// Element i of a 1-d `x` for each i in `at` (same shape as `at`).
Value take(Builder& b, const Value& x, const Value& at) {
  Shape s = at.shape();
  s.push_back(1);
  return b.gather_elements(x, b.reshape(at, s));
}

// The bag of each of the n indices (int64 [n]).
Value offset_to_bag(Builder& b, const Value& offsets, int64_t bags, int64_t n) {
  Value starts = b.slice(offsets, {0}, {bags});
  Value marks = scatter_add_rows(b, full_i64(b, 0, {n + 1}), starts, full_i64(b, 1, {bags}));
  Value count = prefix_sum(b, marks, 0);
  return b.binary("subtract", b.slice(count, {0}, {n}), full_i64(b, 1, {n}));
}

// CPU's bag_size: the differences of the offsets (the last bag's end is n),
// less the bag's padding entries (int64 [bags]).
Value bag_sizes(Builder& b, const Value& offsets, int64_t bags, int64_t n, const Value& bag,
                const Value& keep) {
  Value starts = b.slice(offsets, {0}, {bags});
  Value ends = b.concatenate({b.slice(offsets, {1}, {bags}), full_i64(b, n, {1})}, 0);
  Value pads = scatter_add_rows(b, full_i64(b, 0, {bags}), bag, b.convert(b.unary("not", keep), DType::I64));
  return b.binary("subtract", b.binary("subtract", ends, starts), pads);
}

// (rows[b, d], d) index pairs [bags, D, 2]: one element per column of the
// given rows (max mode's winners).
Value row_column_pairs(Builder& b, const Value& rows) {
  int64_t bags = rows.shape()[0], d = rows.shape()[1];
  Value cols = b.iota({DType::I64, rows.shape()}, 1);
  return b.concatenate({b.reshape(rows, {bags, d, 1}), b.reshape(cols, {bags, d, 1})}, 2);
}

Value rows_where(Builder& b, const Value& keep, const Value& rows) {
  return b.select(b.broadcast_in_dim(keep, rows.shape(), {0}), rows, b.zeros(rows.type));
}

Value scaled_rows(Builder& b, const Value& rows, const Value& scale) {
  return b.binary("multiply", rows, b.broadcast_in_dim(b.convert(scale, rows.dtype()), rows.shape(), {0}));
}

// Max mode, as CPU's loop: a bag's first kept entry is taken whatever it holds
// (NaN too), a later one only when strictly greater, so ties go to the first
// and a later NaN never wins. Returns (values, their weight rows), [bags, D];
// a bag with no kept entry gives 0 and 0.
std::pair<Value, Value> bag_max(Builder& b, const Value& rows, const Value& idx, const Value& bag,
                                const Value& keep, int64_t bags) {
  int64_t n = rows.shape()[0], d = rows.shape()[1];
  Shape bd{bags, d};
  Value pos = b.iota({DType::I64, {n}}, 0);
  Value first = scatter_rows(b, full_i64(b, n, {bags}), bag, b.select(keep, pos, full_i64(b, n, {n})),
                             "stablehlo.minimum");
  // Numbers take part in a maximum (whose NaN handling differs between
  // backends); a NaN wins only as its bag's first entry.
  Value nan = b.compare(Cmp::NE, rows, rows);
  Value valid = b.binary("and", b.broadcast_in_dim(keep, rows.shape(), {0}), b.unary("not", nan));
  Value best = scatter_rows(b, b.splat(Scalar::from_float(-INFINITY), {rows.dtype(), bd}), bag,
                            b.select(valid, rows, splat_like(b, -INFINITY, rows)), "stablehlo.maximum");
  Value hit = b.binary("and", valid, b.compare(Cmp::EQ, rows, gather_rows(b, best, bag)));
  Value all_pos = b.broadcast_in_dim(pos, rows.shape(), {0});
  Value win = scatter_rows(b, full_i64(b, n, bd), bag, b.select(hit, all_pos, full_i64(b, n, rows.shape())),
                           "stablehlo.minimum");
  Value has_first = b.compare(Cmp::LT, first, full_i64(b, n, {bags}));
  Value first_row = gather_rows(b, rows, b.select(has_first, first, full_i64(b, 0, {bags})));
  Value nan_first = b.binary("and", b.broadcast_in_dim(has_first, bd, {0}), b.compare(Cmp::NE, first_row, first_row));
  win = b.select(nan_first, b.broadcast_in_dim(first, bd, {0}), win);
  Value found = b.compare(Cmp::LT, win, full_i64(b, n, bd));
  win = b.select(found, win, full_i64(b, 0, bd));
  Value values = b.select(found, b.gather_elements(rows, row_column_pairs(b, win)), b.zeros({rows.dtype(), bd}));
  Value words = b.select(found, take(b, idx, win), full_i64(b, 0, bd));
  return {values, words};
}

std::vector<Value> embedding_bag(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& weight = ctx.tensor("weight");
  const Value& indices = ctx.tensor("indices");
  const Value& offsets = ctx.tensor("offsets");
  if (indices.rank() != 1 && indices.rank() != 2)
    ctx.fail("input has to be a 1D or 2D Tensor, but got Tensor of dimension " + std::to_string(indices.rank()));
  if (indices.rank() == 2)
    ctx.fail("embedding_bag on tpu takes 1-d indices with offsets (torch.nn.functional.embedding_bag "
             "flattens 2-d input)");
  if (offsets.rank() != 1)
    ctx.fail("offsets has to be a 1D Tensor, but got Tensor of dimension " + std::to_string(offsets.rank()));
  if (weight.rank() != 2)
    ctx.fail("weight has to be a 2D Tensor, but got Tensor of dimension " + std::to_string(weight.rank()));
  int64_t mode = ctx.to_int("mode", 0), padding_idx = ctx.to_int("padding_idx", -1);
  bool weighted = ctx.has("per_sample_weights");
  if (weighted && ctx.tensor("per_sample_weights").dtype() != weight.dtype())
    ctx.fail(std::string("embedding_bag: expected per_sample_weights to have the same dtype as weight (") +
             dtype_name(weight.dtype()) + "), got " + dtype_name(ctx.tensor("per_sample_weights").dtype()));
  int64_t n = indices.shape()[0], o = offsets.shape()[0], words = weight.shape()[0];
  const TensorType& out = ctx.out(0);
  int64_t bags = out.shape[0], d = out.shape[1];
  Value idx = b.convert(indices, DType::I64), off = b.convert(offsets, DType::I64);

  ctx.check_indices(idx, 0, words,
                    "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be outside [0, " +
                        std::to_string(words) + ")",
                    LoweringContext::CheckError::Runtime);
  if (o > 0) {
    Value first = b.reshape(b.slice(off, {0}, {1}), {});
    ctx.check_all(b.compare(Cmp::EQ, first, full_i64(b, 0, {})),
                  "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                  "position 0.",
                  LoweringContext::CheckError::Runtime);
    Value last = b.reshape(b.slice(off, {o - 1}, {o}), {});
    ctx.check_all(b.compare(Cmp::LE, last, full_i64(b, n, {})),
                  "offsets[-1] can not be greater than input's length " + std::to_string(n),
                  LoweringContext::CheckError::Runtime);
  }
  auto fill = [&](size_t i, const Value& v) {
    const TensorType& t = ctx.out(i);
    return b.reshape(b.convert(v, t.dtype), t.shape);
  };
  if (n == 0 || bags == 0 || d == 0) {
    std::vector<Value> r;  // (empty bags: zeros, as CPU)
    for (size_t i = 0; i < 4; ++i) r.push_back(b.zeros(ctx.out(i)));
    return r;
  }
  Value bag = offset_to_bag(b, off, bags, n);
  Value keep = b.compare(Cmp::NE, idx, full_i64(b, padding_idx, {n}));
  Value size = bag_sizes(b, off, bags, n, bag, keep);

  Value result, max_words;
  if (mode == kMax) {
    auto [values, rows_of] = bag_max(b, gather_rows(b, weight, idx), idx, bag, keep, bags);
    result = values;
    max_words = rows_of;
  } else {
    DType acc = math_dtype(out.dtype);
    Value rows = b.convert(gather_rows(b, weight, idx), acc);
    if (weighted) rows = scaled_rows(b, rows, ctx.tensor("per_sample_weights"));
    Value sum = scatter_add_rows(b, b.zeros({acc, {bags, d}}), bag, rows_where(b, keep, rows));
    result = b.convert(sum, out.dtype);
    if (mode == kMean) {  // CPU rounds the sum to the output type, then divides in it
      Value count = b.convert(b.binary("maximum", size, full_i64(b, 1, {bags})), acc);
      result = b.convert(b.binary("divide", b.convert(result, acc),
                                  b.broadcast_in_dim(count, {bags, d}, {0})), out.dtype);
    }
  }
  std::vector<Value> r{result, ctx.out(1).numel() == n ? fill(1, bag) : b.zeros(ctx.out(1))};
  int64_t sizes = ctx.out(2).numel();
  r.push_back(sizes == bags ? fill(2, size)
              : sizes == bags + 1 ? fill(2, b.concatenate({size, full_i64(b, 0, {1})}, 0))
                                  : b.zeros(ctx.out(2)));
  r.push_back(mode == kMax && ctx.out(3).numel() == bags * d ? fill(3, max_words) : b.zeros(ctx.out(3)));
  return r;
}

// CPU's scale_grad_by_freq count for each index, as its kernel computes it:
// the entries of the g-th distinct index value (in sorted order) are divided by
// the count of the g-th element of the sorted indices (not of their own value
// unless every value before it occurs once). Kept for parity with CPU.
Value cpu_frequency(Builder& b, const Value& idx, int64_t words) {
  int64_t n = idx.shape()[0];
  Value counts = scatter_add_rows(b, full_i64(b, 0, {words}), idx, full_i64(b, 1, {n}));
  Value present = b.convert(b.compare(Cmp::GT, counts, full_i64(b, 0, {words})), DType::I64);
  Value before = b.binary("subtract", prefix_sum(b, present, 0), present);
  Value group = take(b, before, idx);
  Value sorted = sort_with_indices(b, idx, 0, false).first;
  return take(b, counts, take(b, sorted, group));
}

// _embedding_bag_backward and _embedding_bag_dense_backward: the dense
// gradient of the weight, [num_weights, D].
std::vector<Value> embedding_bag_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  if (ctx.find("sparse") && ctx.to_bool("sparse", false))
    ctx.not_implemented(kNoSparse);
  const TensorType& out = ctx.out();
  int64_t words = out.shape[0], d = out.shape[1];
  DType acc = math_dtype(out.dtype);
  Value grad = b.convert(ctx.tensor("grad"), acc);
  int64_t bags = grad.shape()[0];
  Value idx = b.convert(ctx.tensor("indices"), DType::I64);
  int64_t n = idx.type.numel();
  if (out.numel() == 0) return {b.zeros(out)};
  int64_t mode = ctx.to_int("mode", 0), padding_idx = ctx.to_int("padding_idx", -1);
  Value zero = b.zeros({acc, {words, d}});
  if (mode == kMax) {
    Value rows = b.convert(ctx.tensor("maximum_indices"), DType::I64);
    Value sizes = b.convert(ctx.tensor("bag_size"), DType::I64);
    Value nonempty = b.compare(Cmp::NE, b.slice(sizes, {0}, {bags}), full_i64(b, 0, {bags}));
    return {b.convert(b.scatter_elements(zero, row_column_pairs(b, rows), rows_where(b, nonempty, grad), "stablehlo.add"),
                      out.dtype)};
  }
  if (n == 0 || bags == 0) return {b.zeros(out)};
  Value bag = b.convert(ctx.tensor("offset2bag"), DType::I64);
  if (bag.type.numel() != n) {  // (CPU's forward leaves it empty on its fast path)
    if (!ctx.find("offsets")) ctx.fail("embedding_bag_backward: offset2bag must have one entry per index");
    bag = offset_to_bag(b, b.convert(ctx.tensor("offsets"), DType::I64), bags, n);
  }
  Value rows = gather_rows(b, grad, bag);
  Value scale = b.splat(Scalar::from_float(1.0), {DType::F64, {n}});
  bool scaled = false;
  if (ctx.has("per_sample_weights")) {
    scale = b.convert(ctx.tensor("per_sample_weights"), DType::F64);
    scaled = true;
  }
  if (ctx.to_bool("scale_grad_by_freq", false)) {
    scale = b.binary("divide", scale, b.convert(cpu_frequency(b, idx, words), DType::F64));
    scaled = true;
  }
  if (mode == kMean) {
    Value size = b.convert(take(b, b.convert(ctx.tensor("bag_size"), DType::I64), bag), DType::F64);
    Value zero_size = b.compare(Cmp::EQ, size, b.zeros(size.type));
    scale = b.select(zero_size, scale, b.binary("divide", scale, size));
    scaled = true;
  }
  if (scaled) rows = scaled_rows(b, rows, b.convert(scale, out.dtype));  // (CPU casts the scale to scalar_t)
  Value keep = b.compare(Cmp::NE, idx, full_i64(b, padding_idx, {n}));
  return {b.convert(scatter_add_rows(b, zero, idx, rows_where(b, keep, rows)), out.dtype)};
}

// d output / d per_sample_weights[i] = grad[bag(i)] . weight[indices[i]], 0 for padding.
std::vector<Value> per_sample_weights_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  int64_t n = out.numel();
  if (ctx.to_int("mode", 0) != 0)
    ctx.fail("embedding_bag_backward: per_sample_weights only supported for mode='sum'");
  if (n == 0) return {b.zeros(out)};
  DType acc = math_dtype(out.dtype);
  Value grad = b.convert(ctx.tensor("grad"), acc);
  Value idx = b.convert(ctx.tensor("indices"), DType::I64);
  Value bag = b.convert(ctx.tensor("offset2bag"), DType::I64);
  if (bag.type.numel() != n)
    bag = offset_to_bag(b, b.convert(ctx.tensor("offsets"), DType::I64), grad.shape()[0], n);
  if (grad.shape()[0] == 0 || grad.shape()[1] == 0) return {b.zeros(out)};
  Value prod = b.binary("multiply", gather_rows(b, grad, bag), b.convert(gather_rows(b, ctx.tensor("weight"), idx), acc));
  Value dot = b.reduce(prod, b.zeros({acc, {}}), {1}, "stablehlo.add");
  Value keep = b.compare(Cmp::NE, idx, full_i64(b, ctx.to_int("padding_idx", -1), {n}));
  return {b.convert(b.select(keep, dot, b.zeros(dot.type)), out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("_embedding_bag", embedding_bag);
TORCH_PJRT_LOWERING("_embedding_bag_forward_only", embedding_bag);
TORCH_PJRT_LOWERING("_embedding_bag_backward", embedding_bag_backward);
TORCH_PJRT_LOWERING("_embedding_bag_dense_backward", embedding_bag_backward);
TORCH_PJRT_LOWERING("_embedding_bag_per_sample_weights_backward", per_sample_weights_backward);

}  // namespace torch_pjrt::lowering::ops
