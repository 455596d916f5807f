// _softmax and _log_softmax, numerically stable: the max along `dim` is
// subtracted before exponentiating. float16/bfloat16 are computed in float32
// like PyTorch's CPU kernels (half_to_float only changes the result dtype,
// which Meta already put in ctx.out()).
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
  Value r = softmax_along(b, x, dim, log);
  return {b.reshape(r, ctx.out().shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("_softmax", [](LoweringContext& c) { return softmax(c, false); });
TORCH_PJRT_LOWERING("_log_softmax", [](LoweringContext& c) { return softmax(c, true); });

}  // namespace torch_pjrt::lowering::ops
