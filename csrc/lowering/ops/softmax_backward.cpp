// Backward of _softmax and _log_softmax, from the forward's output:
//   softmax:     grad_in = y * (g - sum(g * y, dim))
//   log_softmax: grad_in = g - exp(y) * sum(g, dim)
// Computed in float32 for half types; the result takes `input_dtype` (Meta put
// it in ctx.out(); it differs from grad's dtype after half_to_float).
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> softmax_backward(LoweringContext& ctx, bool log) {
  Builder& b = ctx.b;
  Value g = ctx.tensor("grad_output"), y = ctx.tensor("output");
  DType acc = math_dtype(promote_types(g.dtype(), y.dtype()));
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), y.rank());
  g = b.convert(g, acc);
  y = b.convert(y, acc);
  if (y.rank() == 0) {
    g = b.reshape(g, {1});
    y = b.reshape(y, {1});
  }
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < y.rank(); ++i)
    if (i != dim) kept.push_back(i);
  auto sum = [&](const Value& v) {
    return b.broadcast_in_dim(b.reduce(v, b.constant(0.0, acc), {dim}, "stablehlo.add"), v.shape(), kept);
  };
  Value r = log ? b.binary("subtract", g, b.binary("multiply", b.unary("exponential", y), sum(g)))
                : b.binary("multiply", y, b.binary("subtract", g, sum(b.binary("multiply", g, y))));
  return {b.reshape(b.convert(r, ctx.out().dtype), ctx.out().shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("_softmax_backward_data", [](LoweringContext& c) { return softmax_backward(c, false); });
TORCH_PJRT_LOWERING("_log_softmax_backward_data", [](LoweringContext& c) { return softmax_backward(c, true); });

}  // namespace torch_pjrt::lowering::ops
