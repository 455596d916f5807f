// Helpers shared by the linear-algebra lowerings (linalg.cpp, lu.cpp).
#pragma once

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

// The lower (or upper) triangle of the last two dims of x, zeros elsewhere.
Value triangle(Builder& b, const Value& x, bool lower);
// X with op(a) X = rhs (left) or X op(a) = rhs, a triangular (stablehlo.triangular_solve).
Value triangular_solve(Builder& b, const Value& a, const Value& rhs, bool left, bool lower, bool unit,
                       bool transpose);
// x's last two dims kept, its batch dims broadcast to `batch`.
Value with_batch(Builder& b, const Value& x, const Shape& batch);
Shape batch_of(const Shape& s);
// x with its leading dims (all but the last `keep`) merged into one: [bt, ...].
Value flatten_batch(Builder& b, const Value& x, int keep);
// Identity matrices of type t (batched over its leading dims).
Value identity_like(Builder& b, const TensorType& t);
// Real floating dtypes only (complex ones take the CPU fallback before this).
void real_only(LoweringContext& ctx, DType t);

}  // namespace torch_pjrt::lowering::ops
