// Activation functions. float16/bfloat16 are computed in float32 and rounded
// once, as PyTorch's CPU kernels do.
#include <cmath>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {


std::vector<Value> relu(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  Value zero = splat_like(b, 0, x);
  // x < 0 rather than max(x, 0) so that NaN passes through.
  return {b.select(b.compare(Cmp::LT, x, zero), zero, x)};
}

std::vector<Value> gelu(LoweringContext& ctx) {
  bool tanh = ctx.str("approximate", "none") == "tanh";
  return float_unary(ctx, [&](Builder& b, const Value& x) { return gelu_value(b, x, tanh); });
}

// silu = x / (1 + exp(-x)), CPU's formula: x * sigmoid(x) lost every value
// below -87.3 in float32 (sigmoid's subnormal result is flushed: -0 where
// CPU gives -2e-37).
std::vector<Value> silu(LoweringContext& ctx) {
  return float_unary(ctx, [](Builder& b, const Value& x) {
    Value denom = b.binary("add", splat_like(b, 1, x), b.unary("exponential", b.unary("negate", x)));
    return b.binary("divide", x, denom);
  });
}

}  // namespace

TORCH_PJRT_LOWERING("relu", relu);
TORCH_PJRT_LOWERING("gelu", gelu);
TORCH_PJRT_LOWERING("silu", silu);
TORCH_PJRT_LOWERING("sigmoid", [](LoweringContext& c) {
  return float_unary(c, [](Builder& b, const Value& x) { return b.unary("logistic", x); });
});

}  // namespace torch_pjrt::lowering::ops
