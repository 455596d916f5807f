// Advanced indexing (index.Tensor, index_put and their _unsafe/_impl forms)
// and masked_scatter (with its backward).
//
// Index ranges are checked in the program (ctx.check_indices, reported at the
// next host read with CPU's exception type): XLA's gather itself clamps
// out-of-range indices and its scatter drops out-of-range updates, where
// PyTorch raises. Negative indices wrap, as in PyTorch.
#include <algorithm>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}

// "name = [..], " or nothing: StableHLO's printer omits empty dimension lists.
std::string dims_attr(const std::string& name, const std::vector<int64_t>& v) {
  return v.empty() ? "" : name + " = " + i64_list(v) + ", ";
}

// idx (any int dtype) as i64, negative entries wrapped by `size`.
Value wrap_index(Builder& b, const Value& idx, int64_t size) {
  Value i = b.convert(idx, DType::I64);
  Value neg = b.compare(Cmp::LT, i, b.zeros(i.type));
  return b.select(neg, b.binary("add", i, b.splat(Scalar::from_int(size), i.type)), i);
}

// Inclusive prefix sum along a rank-1 array (Hillis-Steele: log2(n) shifted adds;
// reduce_window would be quadratic on XLA's CPU backend).
Value cumsum_1d(Builder& b, Value x) {
  int64_t n = x.shape()[0];
  Value zero = b.zeros(TensorType{x.dtype(), {}});
  for (int64_t s = 1; s < n; s *= 2)
    x = b.binary("add", x, b.pad(b.slice(x, {0}, {n - s}), zero, {s}, {0}));
  return x;
}

// ---------------------------------------------------------------------------
// Advanced indexing. self is transposed so the indexed dims come first, then
// one gather/scatter with the index tensors (broadcast together and stacked
// along a last dim) picks whole slices of the remaining dims.

struct AdvancedIndex {
  std::vector<int64_t> perm;   // indexed dims, then the others (a permutation of self)
  int64_t num_indexed = 0;
  Shape batch;                 // broadcast shape of the index tensors
  Shape rest;                  // sizes of the non-indexed dims, in order
  Value indices;               // batch + [num_indexed], i64, wrapped
  // Order of the gathered [batch..., rest...] dims in PyTorch's result: when
  // the indexed dims are adjacent the batch dims replace them in place,
  // otherwise they come first.
  std::vector<int64_t> result_perm;
};

AdvancedIndex advanced_index(LoweringContext& ctx, const Value& self) {
  Builder& b = ctx.b;
  const Arg& arg = ctx.arg("indices");
  AdvancedIndex ai;
  std::vector<int64_t> indexed;
  std::vector<Value> idx;
  if (arg.kind == Arg::OptTensorList) {
    // (PyTorch's Meta kernel of index_put does not check this.)
    if (static_cast<int64_t>(arg.opt_tensors.size()) > self.rank())
      ctx.index_error("too many indices for tensor of dimension " + std::to_string(self.rank()) + " (got " +
                      std::to_string(arg.opt_tensors.size()) + ")");
    for (size_t d = 0; d < arg.opt_tensors.size(); ++d) {
      if (!arg.opt_tensors[d]) continue;
      const Value& t = *arg.opt_tensors[d];
      // PyTorch turns masks into long indices with nonzero(): a data-dependent
      // shape. index_put handles a lone mask without it (masked_index_put).
      if (t.dtype() == DType::Bool || t.dtype() == DType::U8)
        ctx.fail("a boolean/uint8 mask combined with other index tensors is not supported");
      if (!is_integral(t.dtype(), false))
        ctx.index_error("tensors used as indices must be long, int, byte or bool tensors");
      indexed.push_back(static_cast<int64_t>(d));
      idx.push_back(t);
      ai.batch = broadcast_shapes(ai.batch, t.shape());
    }
  }
  // CPU fails an internal assert here; an error beats a silent no-op.
  if (indexed.empty()) ctx.fail("at least one index tensor is required");
  ai.num_indexed = static_cast<int64_t>(indexed.size());
  ai.perm = indexed;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (std::find(indexed.begin(), indexed.end(), d) == indexed.end()) {
      ai.perm.push_back(d);
      ai.rest.push_back(self.shape()[d]);
    }
  Shape coord_shape = ai.batch;
  coord_shape.push_back(1);
  std::vector<Value> coords;
  // CPU checks the indices as it reads or writes elements: none when the
  // broadcast indices or the slices they pick are empty.
  bool touches = numel(ai.batch) > 0 && numel(ai.rest) > 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    int64_t size = self.shape()[indexed[j]];
    if (touches)
      ctx.check_indices(idx[j], -size, size,
                        "index out of bounds for dimension " + std::to_string(indexed[j]) + " with size " +
                            std::to_string(size));
    Value w = wrap_index(b, b.broadcast_to(idx[j], ai.batch), size);
    coords.push_back(b.reshape(w, coord_shape));
  }
  int64_t nb = static_cast<int64_t>(ai.batch.size()), nr = static_cast<int64_t>(ai.rest.size());
  ai.indices = b.concatenate(coords, nb);
  bool adjacent = !indexed.empty() && indexed.back() - indexed.front() + 1 == ai.num_indexed;
  int64_t p = adjacent ? indexed.front() : 0;  // non-indexed dims before the indexed ones
  for (int64_t i = 0; i < p; ++i) ai.result_perm.push_back(nb + i);
  for (int64_t i = 0; i < nb; ++i) ai.result_perm.push_back(i);
  for (int64_t i = p; i < nr; ++i) ai.result_perm.push_back(nb + i);
  return ai;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

// index.Tensor(self, indices), also _unsafe_index.
std::vector<Value> index(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  const TensorType& out = ctx.out();
  AdvancedIndex ai = advanced_index(ctx, self);
  if (out.numel() == 0) return {b.zeros(out)};
  Value x = b.transpose(self, ai.perm);
  int64_t nb = static_cast<int64_t>(ai.batch.size()), nr = static_cast<int64_t>(ai.rest.size());
  Shape slice_sizes(ai.num_indexed, 1);
  slice_sizes.insert(slice_sizes.end(), ai.rest.begin(), ai.rest.end());
  Shape gathered = ai.batch;
  gathered.insert(gathered.end(), ai.rest.begin(), ai.rest.end());
  Value g = b.op("stablehlo.gather", {x, ai.indices}, TensorType{self.dtype(), gathered},
                 "dimension_numbers = #stablehlo.gather<" + dims_attr("offset_dims", range(nb, nb + nr)) +
                     dims_attr("collapsed_slice_dims", range(0, ai.num_indexed)) +
                     "start_index_map = " + i64_list(range(0, ai.num_indexed)) +
                     ", index_vector_dim = " + std::to_string(nb) +
                     ">, slice_sizes = " + i64_array(slice_sizes) + ", indices_are_sorted = false");
  return {b.transpose(g, ai.result_perm)};
}

// x[mask] = values (op)= with one bool/uint8 mask covering self's dims
// [p, p + mask.rank): no nonzero() needed, since where the mask is true each
// element takes the next value in order. values broadcast to
// self.shape[:p] + [nnz] + self.shape[p+k:]; its nnz dim is 1 (one value for all)
// or nnz, which is only known on the device (not checked; gather clamps).
Value masked_index_put(LoweringContext& ctx, const Value& self, int64_t p, const Value& mask_in, DType dt,
                       bool accumulate) {
  Builder& b = ctx.b;
  int64_t k = mask_in.rank();
  if (p + k > self.rank())
    ctx.index_error("too many indices for tensor of dimension " + std::to_string(self.rank()) + " (got " +
                    std::to_string(p + k) + ")");
  Shape before(self.shape().begin(), self.shape().begin() + p);
  Shape masked(self.shape().begin() + p, self.shape().begin() + p + k);
  Shape after(self.shape().begin() + p + k, self.shape().end());
  for (int64_t j = 0; j < k; ++j)
    if (mask_in.shape()[j] != masked[j])
      ctx.index_error("The shape of the mask [" + std::to_string(mask_in.shape()[j]) + "] at index " +
                      std::to_string(j) + " does not match the shape of the indexed tensor [" +
                      std::to_string(masked[j]) + "] at index " + std::to_string(p + j));
  Value mask = b.convert(mask_in, DType::Bool);
  Value values = b.convert(ctx.tensor("values"), dt);
  Shape result = before;
  int64_t m = numel(masked);
  int64_t nnz_dim = static_cast<int64_t>(before.size());
  int64_t vdim = values.rank() - (static_cast<int64_t>(after.size()) + 1);  // values' dim facing nnz
  int64_t n = vdim >= 0 && vdim < values.rank() ? values.shape()[vdim] : 1;
  if (n == 0) {  // no values: PyTorch requires no true entries
    if (m > 0)
      ctx.check_all(b.unary("not", mask), "shape mismatch: value tensor of shape [0] cannot be broadcast to "
                                          "indexing result", LoweringContext::CheckError::Runtime);
    return b.convert(self, dt);
  }
  result.push_back(n);
  result.insert(result.end(), after.begin(), after.end());
  Value v = b.broadcast_to(values, result);  // before + [n] + after
  if (n != 1) {
    // The i-th true element (row-major over the mask) takes slice i along nnz_dim.
    Value pos = cumsum_1d(b, b.convert(b.reshape(mask, {m}), DType::I64));
    ctx.check_indices(b.slice(pos, {m - 1}, {m}), n, n + 1,
                      "shape mismatch: value tensor cannot be broadcast to indexing result",
                      LoweringContext::CheckError::Runtime);
    pos = b.binary("subtract", pos, b.splat(Scalar::from_int(1), pos.type));
    Shape gshape = before;
    gshape.push_back(m);
    gshape.insert(gshape.end(), after.begin(), after.end());
    TensorType it{DType::I64, gshape};
    Shape coord_shape = gshape;
    coord_shape.push_back(1);
    std::vector<Value> coords;
    for (int64_t d = 0; d < v.rank(); ++d) {
      Value c = d == nnz_dim ? b.broadcast_in_dim(pos, gshape, {nnz_dim}) : b.iota(it, d);
      coords.push_back(b.reshape(c, coord_shape));
    }
    v = b.gather_elements(v, b.concatenate(coords, v.rank()));
  }
  // [.., n or m, ..] -> self's shape: the nnz dim becomes the mask's k dims.
  Shape expanded = before;
  for (int64_t i = 0; i < k; ++i) expanded.push_back(n == 1 ? 1 : masked[i]);
  expanded.insert(expanded.end(), after.begin(), after.end());
  v = b.broadcast_to(b.reshape(v, expanded), self.shape());
  std::vector<int64_t> mask_dims = range(p, p + k);
  Value mask_full = b.broadcast_in_dim(mask, self.shape(), mask_dims);
  Value x = b.convert(self, dt);
  if (!accumulate) return b.select(mask_full, v, x);
  Value add = b.select(mask_full, v, b.zeros(x.type));
  return b.binary(dt == DType::Bool ? "or" : "add", x, add);
}

// index_put(self, indices, values, accumulate), also _index_put_impl_ (the
// in-place form x[i] = v and the backward of index) and _unsafe_index_put.
// Duplicate indices without accumulate leave one of the values, as on CPU
// (which one is unspecified in both).
std::vector<Value> index_put(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  DType dt = ctx.out().dtype;
  bool accumulate = ctx.to_bool("accumulate", false);
  const Arg& indices = ctx.arg("indices");
  if (indices.kind == Arg::OptTensorList) {
    int64_t given = 0, mask_pos = -1;
    for (size_t d = 0; d < indices.opt_tensors.size(); ++d) {
      if (!indices.opt_tensors[d]) continue;
      ++given;
      DType it = indices.opt_tensors[d]->dtype();
      if (it == DType::Bool || it == DType::U8) mask_pos = static_cast<int64_t>(d);
    }
    if (mask_pos >= 0 && given == 1) {
      if (self.type.numel() == 0) return {self};
      return {masked_index_put(ctx, self, mask_pos, *indices.opt_tensors[mask_pos], dt, accumulate)};
    }
  }
  AdvancedIndex ai = advanced_index(ctx, self);
  if (self.type.numel() == 0) return {self};
  int64_t nb = static_cast<int64_t>(ai.batch.size()), nr = static_cast<int64_t>(ai.rest.size());
  // values broadcast to what self[indices] would be, then laid out as the gather's [batch, rest].
  Shape gathered = ai.batch;
  gathered.insert(gathered.end(), ai.rest.begin(), ai.rest.end());
  Shape result;
  for (auto d : ai.result_perm) result.push_back(gathered[d]);
  if (numel(result) == 0) return {self};
  Value v = b.broadcast_to(b.convert(ctx.tensor("values"), dt), result);
  v = b.transpose(v, inverse(ai.result_perm));
  Value x = b.transpose(b.convert(self, dt), ai.perm);
  std::string combine;  // replace
  if (accumulate) combine = dt == DType::Bool ? "stablehlo.or" : "stablehlo.add";
  Value s = b.op_multi(
      "stablehlo.scatter", {x, ai.indices, v}, {x.type},
      "scatter_dimension_numbers = #stablehlo.scatter<" + dims_attr("update_window_dims", range(nb, nb + nr)) +
          "inserted_window_dims = " + i64_list(range(0, ai.num_indexed)) +
          ", scatter_dims_to_operand_dims = " + i64_list(range(0, ai.num_indexed)) +
          ", index_vector_dim = " + std::to_string(nb) +
          ">, indices_are_sorted = false, unique_indices = false",
      b.scatter_region(dt, combine))[0];
  return {b.transpose(s, inverse(ai.perm))};
}

// ---------------------------------------------------------------------------
// masked_scatter(self, mask, source): the k-th true position of mask (row-major)
// takes source.flatten()[k]. The position comes from a prefix sum of the mask.

std::vector<Value> masked_scatter(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value self = b.broadcast_to(b.convert(ctx.tensor("self"), out.dtype), out.shape);
  Value mask = b.broadcast_to(b.convert(ctx.tensor("mask"), DType::Bool), out.shape);
  const Value& source = ctx.tensor("source");
  int64_t n = out.numel(), m = source.type.numel();
  if (n == 0 || m == 0) return {self};  // with no source elements PyTorch requires no true entries
  Value flat_mask = b.reshape(mask, {n});
  Value pos = cumsum_1d(b, b.convert(flat_mask, DType::I64));
  ctx.check_indices(b.slice(pos, {n - 1}, {n}), 0, m + 1,
                    "masked_scatter: number of elements in source < number of ones in mask",
                    LoweringContext::CheckError::Runtime);
  pos = b.binary("subtract", pos, b.splat(Scalar::from_int(1), pos.type));
  // Positions past the source's end only occur where PyTorch raises; gather clamps them.
  Value src = b.reshape(b.convert(source, out.dtype), {m});
  Value picked = b.gather_elements(src, b.reshape(pos, {n, 1}));
  return {b.select(mask, b.reshape(picked, out.shape), self)};
}

// masked_scatter_backward(grad_output, mask, sizes): the gradient of source,
// grad_output at the true positions of mask in order, zeros after them.
std::vector<Value> masked_scatter_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  const Value& grad = ctx.tensor("grad_output");
  int64_t n = grad.type.numel(), m = out.numel();
  if (m == 0 || n == 0) return {b.zeros(out)};
  Value mask = b.reshape(b.broadcast_to(b.convert(ctx.tensor("mask"), DType::Bool), grad.shape()), {n});
  Value pos = cumsum_1d(b, b.convert(mask, DType::I64));
  pos = b.binary("subtract", pos, b.splat(Scalar::from_int(1), pos.type));
  // Unselected elements are sent to index m, which the scatter drops.
  pos = b.select(mask, pos, b.splat(Scalar::from_int(m), pos.type));
  Value g = b.reshape(b.convert(grad, out.dtype), {n});
  Value r = b.scatter_elements(b.zeros(TensorType{out.dtype, {m}}), b.reshape(pos, {n, 1}), g);
  return {b.reshape(r, out.shape)};
}

}  // namespace

// take(self, index): self flattened, read at index (negative ones wrap); an
// index out of range raises IndexError, as other index checks do.
static std::vector<Value> take(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value self = ctx.tensor("self"), index = ctx.tensor("index");
  const TensorType& out = ctx.out();
  int64_t n = self.type.numel();
  if (index.type.numel() == 0) return {b.zeros(out)};
  if (n == 0) ctx.index_error("take(): tried to take from an empty tensor");
  ctx.check_indices(index, -n, n, "out of range: an index of take() is outside a tensor of " +
                                      std::to_string(n) + " elements");
  Shape coord = index.shape();
  coord.push_back(1);
  Value at = b.reshape(wrap_index(b, index, n), coord);
  return {b.reshape(b.gather_elements(b.reshape(self, {n}), at), out.shape)};
}

// put(self, index, source, accumulate): source written (or added) into self
// flattened at index, the inverse of take (its backward).
static std::vector<Value> put(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value self = ctx.tensor("self"), index = ctx.tensor("index");
  const TensorType& out = ctx.out();
  int64_t n = self.type.numel(), k = index.type.numel();
  if (k == 0) return {self};
  if (n == 0) ctx.index_error("put(): Tried to put elements into an empty tensor");
  ctx.check_indices(index, -n, n, "out of range: an index of put() is outside a tensor of " +
                                      std::to_string(n) + " elements");
  if (ctx.tensor("source").type.numel() != k)
    ctx.index_error("put_(): Expected source and index to have the same number of elements, but got "
                    "source.numel() = " + std::to_string(ctx.tensor("source").type.numel()) +
                    ", index.numel() = " + std::to_string(k));
  Value at = b.reshape(wrap_index(b, index, n), {k, 1});
  Value src = b.reshape(b.convert(ctx.tensor("source"), self.dtype()), {k});
  bool add = ctx.to_bool("accumulate", false);
  std::string combine = !add ? "" : self.dtype() == DType::Bool ? "stablehlo.or" : "stablehlo.add";
  return {b.reshape(b.scatter_elements(b.reshape(self, {n}), at, src, combine), out.shape)};
}

TORCH_PJRT_LOWERING("take", take);
TORCH_PJRT_LOWERING("put", put);
TORCH_PJRT_LOWERING("index", index);
TORCH_PJRT_LOWERING("_unsafe_index", index);
TORCH_PJRT_LOWERING("index_put", index_put);
TORCH_PJRT_LOWERING("_index_put_impl", index_put);
TORCH_PJRT_LOWERING("_unsafe_index_put", index_put);
TORCH_PJRT_LOWERING("masked_scatter", masked_scatter);
TORCH_PJRT_LOWERING("masked_scatter_backward", masked_scatter_backward);

}  // namespace torch_pjrt::lowering::ops
