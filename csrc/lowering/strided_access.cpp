#include "lowering/strided_access.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace torch_pjrt::lowering {
namespace {

// A view whose non-trivial dims, sorted by decreasing stride, nest like a
// reshape of a contiguous segment: each stride divides the previous one and
// leaves room for its extent. Then [offset, offset + n0*s0) reshaped to
// [n0, s0/s1, ..., s(k-2)/s(k-1), s(k-1)] and sliced to [n0, n1, ..., 1] is the view.
struct Plan {
  std::vector<int64_t> mem_dims;   // logical dims with size > 1 and stride > 0, by stride desc
  std::vector<int64_t> bcast_dims; // logical dims with size > 1 and stride 0
  bool regular = true;
  Shape base;                      // the reshape of the segment
  int64_t length = 0;              // n0 * s0
};

Plan make_plan(const StridedView& v) {
  Plan p;
  for (size_t i = 0; i < v.sizes.size(); ++i) {
    if (v.sizes[i] == 1) continue;
    (v.strides[i] == 0 ? p.bcast_dims : p.mem_dims).push_back(static_cast<int64_t>(i));
  }
  std::stable_sort(p.mem_dims.begin(), p.mem_dims.end(),
                   [&](int64_t a, int64_t b) { return v.strides[a] > v.strides[b]; });
  size_t k = p.mem_dims.size();
  for (size_t j = 0; j + 1 < k; ++j) {
    int64_t s = v.strides[p.mem_dims[j]], s_next = v.strides[p.mem_dims[j + 1]];
    int64_t n_next = v.sizes[p.mem_dims[j + 1]];
    if (s_next <= 0 || s % s_next != 0 || s < n_next * s_next) p.regular = false;
  }
  if (!p.regular || k == 0) return p;
  p.base.push_back(v.sizes[p.mem_dims[0]]);
  for (size_t j = 0; j + 1 < k; ++j)
    p.base.push_back(v.strides[p.mem_dims[j]] / v.strides[p.mem_dims[j + 1]]);
  p.base.push_back(v.strides[p.mem_dims[k - 1]]);
  p.length = v.sizes[p.mem_dims[0]] * v.strides[p.mem_dims[0]];
  return p;
}

// The flat segment [offset, offset + length), zero-padded past the storage end.
Value segment(Builder& b, const Value& flat, int64_t offset, int64_t length, int64_t* taken) {
  int64_t n = flat.shape()[0];
  int64_t take = std::min(length, n - offset);
  *taken = take;
  Value seg = b.slice(flat, {offset}, {offset + take});
  if (take < length)
    seg = b.pad(seg, b.constant_int(0, flat.dtype()), {0}, {length - take});
  return seg;
}

// A view's span: 1 + the flat distance from its first to its last element.
int64_t span(const StridedView& v) {
  int64_t s = 1;
  for (size_t d = 0; d < v.sizes.size(); ++d) s += (v.sizes[d] - 1) * v.strides[d];
  return s;
}

// The segment [offset, offset + length) for an offset known only at run time:
// the view's span, which lies in the storage for any valid view (no clamping),
// zero-padded to `length`. *taken = the span.
Value dynamic_segment(Builder& b, const Value& flat, const Value& offset, int64_t length, int64_t span_len,
                      int64_t* taken) {
  int64_t take = std::min({span_len, length, flat.shape()[0]});
  *taken = take;
  Value seg = b.dynamic_slice(flat, {offset}, {take});
  if (take < length)
    seg = b.pad(seg, b.constant_int(0, flat.dtype()), {0}, {length - take});
  return seg;
}

Value dynamic_update(Builder& b, const Value& x, const Value& update, const Value& offset) {
  return b.op("stablehlo.dynamic_update_slice", {x, update, offset}, x.type);
}

// Flat element indices of every view element, shape sizes + [1].
Value element_indices(Builder& b, const StridedView& v, const std::optional<Value>& offset) {
  TensorType it{DType::I64, v.sizes};
  Value idx = offset ? b.broadcast_in_dim(*offset, v.sizes, {}) : b.splat(Scalar::from_int(v.offset), it);
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.strides[d] == 0 || v.sizes[d] == 1) continue;
    Value term = b.binary("multiply", b.iota(it, static_cast<int64_t>(d)),
                          b.splat(Scalar::from_int(v.strides[d]), it));
    idx = b.binary("add", idx, term);
  }
  Shape with_vec = v.sizes;
  with_vec.push_back(1);
  return b.reshape(idx, with_vec);
}

Shape sizes_of(const StridedView& v, const std::vector<int64_t>& dims) {
  Shape s;
  for (auto d : dims) s.push_back(v.sizes[d]);
  return s;
}

}  // namespace

namespace {
bool contiguous(const int64_t* sizes, const int64_t* strides, size_t rank) {
  int64_t expected = 1;
  for (size_t i = rank; i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}
}  // namespace

bool StridedView::is_contiguous() const { return contiguous(sizes.data(), strides.data(), sizes.size()); }

bool covers_whole(const int64_t* sizes, const int64_t* strides, size_t rank, int64_t offset, int64_t storage_numel) {
  if (offset != 0) return false;
  int64_t n = 1;
  for (size_t i = 0; i < rank; ++i) n *= sizes[i];
  return n == storage_numel && contiguous(sizes, strides, rank);
}

bool StridedView::covers_whole(int64_t storage_numel) const {
  return lowering::covers_whole(sizes.data(), strides.data(), sizes.size(), offset, storage_numel);
}

Value read_strided(Builder& b, const Value& flat, const StridedView& v, const std::optional<Value>& offset) {
  TensorType out{flat.dtype(), v.sizes};
  if (numel(v.sizes) == 0) return b.zeros(out);
  if (v.covers_whole(flat.shape()[0])) return b.reshape(flat, v.sizes);
  Plan p = make_plan(v);
  if (!p.regular) return b.gather_elements(flat, element_indices(b, v, offset));
  Value compact;  // mem dims in stride order
  size_t k = p.mem_dims.size();
  if (k == 0) {
    compact = b.reshape(offset ? b.dynamic_slice(flat, {*offset}, {1}) : b.slice(flat, {v.offset}, {v.offset + 1}),
                        {});
  } else {
    int64_t taken;
    Value seg = offset ? dynamic_segment(b, flat, *offset, p.length, span(v), &taken)
                       : segment(b, flat, v.offset, p.length, &taken);
    Value r = b.reshape(seg, p.base);
    Shape limit = sizes_of(v, p.mem_dims);
    limit.push_back(1);
    r = b.slice(r, Shape(k + 1, 0), limit);
    compact = b.reshape(r, sizes_of(v, p.mem_dims));
  }
  // Back to logical order, then size-1 and broadcast dims.
  std::vector<int64_t> logical = p.mem_dims;
  std::sort(logical.begin(), logical.end());
  std::vector<int64_t> perm;
  for (auto d : logical)
    perm.push_back(std::find(p.mem_dims.begin(), p.mem_dims.end(), d) - p.mem_dims.begin());
  Value ordered = b.transpose(compact, perm);
  return b.broadcast_in_dim(ordered, v.sizes, logical);
}

Value write_strided(Builder& b, const Value& flat, const Value& values, const StridedView& v,
                    const std::optional<Value>& offset) {
  if (numel(v.sizes) == 0) return flat;
  int64_t n = flat.shape()[0];
  if (v.covers_whole(n)) return b.reshape(values, {n});
  Plan p = make_plan(v);
  if (!p.regular || !p.bcast_dims.empty())
    return b.scatter_elements(flat, element_indices(b, v, offset), values);
  size_t k = p.mem_dims.size();
  if (k == 0)
    return offset ? dynamic_update(b, flat, b.reshape(values, {1}), *offset)
                  : b.dynamic_update_slice(flat, b.reshape(values, {1}), {v.offset});
  std::vector<int64_t> logical = p.mem_dims;
  std::sort(logical.begin(), logical.end());
  Value compact = b.reshape(values, sizes_of(v, logical));
  std::vector<int64_t> perm;  // logical order -> stride order
  for (auto d : p.mem_dims)
    perm.push_back(std::find(logical.begin(), logical.end(), d) - logical.begin());
  compact = b.transpose(compact, perm);
  Shape upd_shape = sizes_of(v, p.mem_dims);
  upd_shape.push_back(1);
  Value upd = b.reshape(compact, upd_shape);
  int64_t taken;
  Value old = offset ? dynamic_segment(b, flat, *offset, p.length, span(v), &taken)
                     : segment(b, flat, v.offset, p.length, &taken);
  Value r = b.reshape(old, p.base);
  r = b.dynamic_update_slice(r, upd, Shape(k + 1, 0));
  Value seg = b.slice(b.reshape(r, {p.length}), {0}, {taken});
  return offset ? dynamic_update(b, flat, seg, *offset) : b.dynamic_update_slice(flat, seg, {v.offset});
}

Value reinterpret_flat(Builder& b, const Value& flat, DType to) {
  DType from = flat.dtype();
  if (from == to) return flat;
  // bitcast_convert refuses complex types: split into / join from (re, im) pairs.
  if (is_complex(from)) {
    DType r = real_dtype(from);
    int64_t n = flat.shape()[0];
    Value re = b.reshape(b.op("stablehlo.real", {flat}, TensorType{r, {n}}), {n, 1});
    Value im = b.reshape(b.op("stablehlo.imag", {flat}, TensorType{r, {n}}), {n, 1});
    return reinterpret_flat(b, b.reshape(b.concatenate({re, im}, 1), {2 * n}), to);
  }
  if (is_complex(to)) {
    DType r = real_dtype(to);
    Value parts = reinterpret_flat(b, flat, r);
    int64_t m = parts.shape()[0];
    if (m % 2 != 0)
      throw std::runtime_error("torch_pjrt: storage of " + std::to_string(m * itemsize(r)) +
                               " bytes cannot be viewed as " + dtype_name(to));
    Value pairs = b.reshape(parts, {m / 2, 2});
    Value re = b.reshape(b.slice(pairs, {0, 0}, {m / 2, 1}), {m / 2});
    Value im = b.reshape(b.slice(pairs, {0, 1}, {m / 2, 2}), {m / 2});
    return b.op("stablehlo.complex", {re, im}, TensorType{to, {m / 2}});
  }
  if (from == DType::Bool || to == DType::Bool) {
    Value bytes = from == DType::Bool ? b.convert(flat, DType::U8) : reinterpret_flat(b, flat, DType::U8);
    return to == DType::Bool ? b.convert(bytes, DType::Bool) : reinterpret_flat(b, bytes, to);
  }
  int64_t a = itemsize(from), c = itemsize(to), n = flat.shape()[0];
  if (a == c) return b.bitcast_convert(flat, TensorType{to, {n}});
  if (a > c) {
    Value split = b.bitcast_convert(flat, TensorType{to, {n, a / c}});
    return b.reshape(split, {n * (a / c)});
  }
  if ((n * a) % c != 0)
    throw std::runtime_error("torch_pjrt: storage of " + std::to_string(n * a) +
                             " bytes cannot be viewed as " + dtype_name(to));
  int64_t m = n * a / c;
  Value grouped = b.reshape(flat, {m, c / a});
  return b.bitcast_convert(grouped, TensorType{to, {m}});
}

bool dense_permutation(const Shape& sizes, const Shape& strides, std::vector<int64_t>* perm) {
  std::vector<int64_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (sizes[*it] != 1 && strides[*it] != expected) return false;
    expected *= sizes[*it];
  }
  *perm = order;
  return true;
}

}  // namespace torch_pjrt::lowering
