#pragma once

#include <string>
#include <vector>

namespace torch_pjrt::device {

// Registers the lowering executor as the PrivateUse1 kernel of every
// CompositeExplicitAutograd op (and its in-place, out= and _foreach_ forms)
// that has a lowering. Idempotent; returns the op names it routed.
std::vector<std::string> route_composite_ops_to_lowerings();

// Registers the nested-tensor CPU fallback (nested.cpp) as the
// NestedTensorPrivateUse1 kernel of every op with a NestedTensorCPU kernel.
void route_nested_ops_to_cpu();

}  // namespace torch_pjrt::device
