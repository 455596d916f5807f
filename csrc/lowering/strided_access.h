// Reading and writing a strided view (sizes, strides, storage offset) of a
// flat storage array, as StableHLO. This is how PyTorch's view semantics meet
// XLA's immutable dense arrays: a read decomposes the view into slice /
// reshape / transpose / broadcast (gather only for irregular strides); a write
// is the inverse and yields a new flat storage array.
#pragma once

#include <optional>

#include "lowering/builder.h"

namespace torch_pjrt::lowering {

struct StridedView {
  Shape sizes;
  Shape strides;
  int64_t offset = 0;
  bool covers_whole(int64_t storage_numel) const;  // offset 0, contiguous, all elements
  bool is_contiguous() const;
};

// StridedView::covers_whole on raw arrays (the eager executor asks it of
// every tensor argument, without copying its sizes and strides).
bool covers_whole(const int64_t* sizes, const int64_t* strides, size_t rank, int64_t offset, int64_t storage_numel);

// True when `strides` lay `sizes` out densely in some dim order (a permuted
// contiguous tensor); `perm` is then that order, outermost first.
bool dense_permutation(const Shape& sizes, const Shape& strides, std::vector<int64_t>* perm);

// `flat` is rank-1 of the view's dtype. `offset`, when given, is a 0-d s64
// value holding the view's storage offset at run time (view.offset is then
// only used for covers_whole, which sizes, strides and the storage size decide
// for any valid view): one program serves every offset. The program then
// slices [offset, offset + extent) with dynamic_slice, where extent is the
// view's span, which lies inside the storage for every view PyTorch allows
// (so dynamic_slice's clamping never moves it).
Value read_strided(Builder& b, const Value& flat, const StridedView& view,
                   const std::optional<Value>& offset = std::nullopt);
// Returns `flat` with the view's elements replaced by `values` (shape = sizes).
Value write_strided(Builder& b, const Value& flat, const Value& values, const StridedView& view,
                    const std::optional<Value>& offset = std::nullopt);
// Reinterprets the bytes of a flat array as another dtype (like Tensor.view(dtype)).
Value reinterpret_flat(Builder& b, const Value& flat, DType to);

}  // namespace torch_pjrt::lowering
