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
  std::string approx = ctx.str("approximate", "none");
  return float_unary(ctx, [&](Builder& b, const Value& x) {
    Value half = splat_like(b, 0.5, x), one = splat_like(b, 1, x);
    Value inner;
    if (approx == "tanh") {
      Value x3 = b.binary("multiply", b.binary("multiply", x, x), x);
      Value t = b.binary("add", x, b.binary("multiply", splat_like(b, 0.044715, x), x3));
      inner = b.unary("tanh", b.binary("multiply", splat_like(b, std::sqrt(2.0 / M_PI), x), t));
    } else {
      inner = erf(b, b.binary("multiply", x, splat_like(b, M_SQRT1_2, x)));
    }
    return b.binary("multiply", b.binary("multiply", half, x), b.binary("add", one, inner));
  });
}

std::vector<Value> silu(LoweringContext& ctx) {
  return float_unary(ctx, [](Builder& b, const Value& x) {
    return b.binary("multiply", x, b.unary("logistic", x));
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
