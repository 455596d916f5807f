// Constant fills and value copies. Eager builds these from empty + fill_ and
// its own copy kernels; in compiled graphs (AOTAutograd output) they appear
// as the factory and copy ops themselves. The result type (dtype, shape)
// always comes from PyTorch's meta kernel.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// full(size, fill_value), full_like(self, fill_value), new_full(self, size, fill_value).
// The value may be a runtime input (no program per fill value).
std::vector<Value> full(LoweringContext& ctx) {
  check_scalar_fits(ctx, "fill_value", ctx.out().dtype);
  return {ctx.b.broadcast_to(ctx.operand("fill_value", ctx.out().dtype), ctx.out().shape)};
}

std::vector<Value> constant(LoweringContext& ctx, int64_t v) {
  return {ctx.b.splat(Scalar::from_int(v), ctx.out())};
}

// scalar_tensor(s): a 0-d tensor of s.
// (CPU's checks an integer type's range, as compiled graphs' where(c, x, 1001)
// reaches it; float16's 1e6 is inf there.)
std::vector<Value> scalar_tensor(LoweringContext& ctx) {
  check_scalar_fits(ctx, "s", ctx.out().dtype);
  return {ctx.operand("s", ctx.out().dtype)};
}

// clone, _to_copy, lift_fresh_copy...: self's values in the result dtype.
std::vector<Value> copy_of_self(LoweringContext& ctx) { return {ctx.b.convert(ctx.tensor("self"), ctx.out().dtype)}; }

}  // namespace

TORCH_PJRT_LOWERING("full", full);
TORCH_PJRT_LOWERING("full_like", full);
TORCH_PJRT_LOWERING("new_full", full);
TORCH_PJRT_LOWERING("scalar_tensor", scalar_tensor);
TORCH_PJRT_LOWERING("zeros", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("zeros_like", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("new_zeros", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("ones", [](LoweringContext& c) { return constant(c, 1); });
TORCH_PJRT_LOWERING("ones_like", [](LoweringContext& c) { return constant(c, 1); });
TORCH_PJRT_LOWERING("new_ones", [](LoweringContext& c) { return constant(c, 1); });
// Uninitialized memory: any value is correct; zeros are deterministic.
TORCH_PJRT_LOWERING("empty", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("empty_like", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("empty_strided", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("new_empty", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("new_empty_strided", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("empty_permuted", [](LoweringContext& c) { return constant(c, 0); });
TORCH_PJRT_LOWERING("clone", copy_of_self);
TORCH_PJRT_LOWERING("_to_copy", copy_of_self);
TORCH_PJRT_LOWERING("lift_fresh_copy", copy_of_self);

}  // namespace torch_pjrt::lowering::ops
