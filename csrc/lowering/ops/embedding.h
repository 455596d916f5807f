// Whole-row gathers and scatters shared by embedding and embedding_bag.
#pragma once

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {

// Rows weight[indices] : [*indices, D].
Value gather_rows(Builder& b, const Value& weight, const Value& indices);
// target[indices[i]] += updates[i] for rows (updates [*indices, D], target
// [W, D]); with a rank-1 target and updates shaped like indices, single
// elements. Out-of-range indices are dropped.
Value scatter_add_rows(Builder& b, const Value& target, const Value& indices, const Value& updates);
// The same with another combiner ("stablehlo.maximum", "stablehlo.minimum").
Value scatter_rows(Builder& b, const Value& target, const Value& indices, const Value& updates,
                   const std::string& combine_op);

}  // namespace torch_pjrt::lowering::ops
