// Embedding lookup and its dense gradient, as whole-row gathers and scatters.
// The lookup's indices are range-checked on the device (ctx.check_indices:
// the error comes at the next host read); the gradient's are not, and its
// scatter drops out-of-range rows.
#include "lowering/ops/embedding.h"

namespace torch_pjrt::lowering::ops {

// Rows weight[indices] : [*indices, D] (the JAX/XLA convention for x[idx] on dim 0,
// index_vector_dim = rank(indices) making each index a 1-vector).
Value gather_rows(Builder& b, const Value& weight, const Value& indices) {
  int64_t k = indices.rank();
  Shape out = indices.shape();
  out.push_back(weight.shape()[1]);
  return b.op("stablehlo.gather", {weight, indices}, TensorType{weight.dtype(), out},
              "dimension_numbers = #stablehlo.gather<offset_dims = [" + std::to_string(k) +
                  "], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = " +
                  std::to_string(k) + ">, slice_sizes = " + i64_array({1, weight.shape()[1]}) +
                  ", indices_are_sorted = false");
}

Value scatter_rows(Builder& b, const Value& target, const Value& indices, const Value& updates,
                   const std::string& combine_op) {
  int64_t k = indices.rank();
  std::string window = target.rank() == 2 ? "[" + std::to_string(k) + "]" : "[]";
  return b.op_multi("stablehlo.scatter", {target, indices, updates}, {target.type},
                    "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " + window +
                        ", inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], "
                        "index_vector_dim = " + std::to_string(k) +
                        ">, indices_are_sorted = false, unique_indices = false",
                    b.binary_region(target.dtype(), combine_op))[0];
}

Value scatter_add_rows(Builder& b, const Value& target, const Value& indices, const Value& updates) {
  return scatter_rows(b, target, indices, updates, "stablehlo.add");
}

namespace {

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): the options
// only matter to the backward.
std::vector<Value> embedding(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& weight = ctx.tensor("weight");
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  ctx.check_indices(ctx.tensor("indices"), 0, weight.shape()[0], "index out of range in self");
  return {gather_rows(b, weight, ctx.tensor("indices"))};
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq) -> [num_weights, D]: rows of grad_output summed into the rows
// their index names, skipping padding_idx, each divided by its index's count when
// scale_grad_by_freq. Half types accumulate in float32.
std::vector<Value> embedding_dense_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (out.numel() == 0) return {b.zeros(out)};
  Value indices = ctx.tensor("indices");
  if (indices.dtype() != DType::I64 && indices.dtype() != DType::I32)
    ctx.fail("embedding_backward: Expected tensor for argument #2 'indices' to have one of the following "
             "scalar types: Long, Int");
  int64_t num_weights = out.shape[0], dim = out.shape[1];
  DType acc = math_dtype(out.dtype);
  // grad_output is [*indices, D]; flatten the index dims.
  int64_t count = indices.type.numel();
  Value idx = b.reshape(indices, {count});
  Value grad = b.reshape(b.convert(ctx.tensor("grad_output"), acc), {count, dim});
  Value keep = b.compare(Cmp::NE, idx, b.splat(Scalar::from_int(ctx.to_int("padding_idx", -1)), idx.type));
  Value zero = b.zeros(grad.type);
  if (ctx.to_bool("scale_grad_by_freq", false)) {
    TensorType ct{acc, {count}};
    Value counts = scatter_add_rows(b, b.zeros(TensorType{acc, {num_weights}}), idx,
                                    b.splat(Scalar::from_float(1.0), ct));
    Value per_index = b.op("stablehlo.gather", {counts, idx}, ct,
                           "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], "
                           "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>, "
                           "indices_are_sorted = false");
    Value scale = b.binary("divide", b.splat(Scalar::from_float(1.0), ct), per_index);
    grad = b.binary("multiply", grad, b.broadcast_in_dim(scale, grad.shape(), {0}));
  }
  grad = b.select(b.broadcast_in_dim(keep, grad.shape(), {0}), grad, zero);
  Value result = scatter_add_rows(b, b.zeros(TensorType{acc, {num_weights, dim}}), idx, grad);
  return {b.convert(result, out.dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("embedding", embedding);
TORCH_PJRT_LOWERING("embedding_dense_backward", embedding_dense_backward);

}  // namespace torch_pjrt::lowering::ops
