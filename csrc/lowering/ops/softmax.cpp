// _softmax and _log_softmax, numerically stable: the max along `dim` is
// subtracted before exponentiating. float16/bfloat16 are computed in float32
// like PyTorch's CPU kernels (half_to_float only changes the result dtype,
// which Meta already put in ctx.out()).
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> softmax(LoweringContext& ctx, bool log) {
  Builder& b = ctx.b;
  Value x = ctx.tensor("self");
  DType acc = x.dtype() == DType::F16 || x.dtype() == DType::BF16 ? DType::F32 : x.dtype();
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), x.rank());
  x = b.convert(x, acc);
  if (x.rank() == 0) x = b.reshape(x, {1});
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) kept.push_back(i);
  double inf = std::numeric_limits<double>::infinity();
  Value m = b.reduce(x, b.constant(-inf, acc), {dim}, "stablehlo.maximum");
  Value shifted = b.binary("subtract", x, b.broadcast_in_dim(m, x.shape(), kept));
  Value e = b.unary("exponential", shifted);
  Value s = b.broadcast_in_dim(b.reduce(e, b.constant(0.0, acc), {dim}, "stablehlo.add"), x.shape(), kept);
  Value r = log ? b.binary("subtract", shifted, b.unary("log", s)) : b.binary("divide", e, s);
  return {b.reshape(r, ctx.out().shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("_softmax", [](LoweringContext& c) { return softmax(c, false); });
TORCH_PJRT_LOWERING("_log_softmax", [](LoweringContext& c) { return softmax(c, true); });

}  // namespace torch_pjrt::lowering::ops
