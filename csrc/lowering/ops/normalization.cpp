// Layer normalization (forward), used by transformer blocks.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) ->
// (out, mean, rstd); statistics in float32 for half types, like PyTorch's CPU kernel.
std::vector<Value> native_layer_norm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  int64_t rank = input.rank();
  int64_t norm_dims = static_cast<int64_t>(ctx.ints("normalized_shape").size());
  DType acc = is_float(input.dtype()) && itemsize(input.dtype()) < 4 ? DType::F32 : input.dtype();
  Value x = b.convert(input, acc);
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int64_t d = rank - norm_dims; d < rank; ++d) {
    dims.push_back(d);
    count *= input.shape()[d];
  }
  Shape kept = ctx.out(1).shape;  // mean/rstd keep the reduced dims as size 1
  Value zero = b.constant(0.0, acc);
  Value n = b.splat(Scalar::from_float(double(count)), TensorType{acc, kept});
  Value mean = b.binary("divide", b.reshape(b.reduce(x, zero, dims, "stablehlo.add"), kept), n);
  Value centered = b.binary("subtract", x, b.broadcast_to(mean, x.shape()));
  Value sq = b.binary("multiply", centered, centered);
  Value var = b.binary("divide", b.reshape(b.reduce(sq, zero, dims, "stablehlo.add"), kept), n);
  Value eps = b.splat(Scalar::from_float(ctx.to_double("eps", 1e-5)), var.type);
  Value rstd = b.unary("rsqrt", b.binary("add", var, eps));
  Value out = b.binary("multiply", centered, b.broadcast_to(rstd, x.shape()));
  if (ctx.has("weight"))
    out = b.binary("multiply", out, b.broadcast_to(b.convert(ctx.tensor("weight"), acc), x.shape()));
  if (ctx.has("bias"))
    out = b.binary("add", out, b.broadcast_to(b.convert(ctx.tensor("bias"), acc), x.shape()));
  return {out, mean, rstd};
}

}  // namespace

TORCH_PJRT_LOWERING("native_layer_norm", native_layer_norm);

}  // namespace torch_pjrt::lowering::ops
