// GradScaler's two ops (torch.amp.GradScaler("tpu")), as on CPU:
// _amp_foreach_non_finite_check_and_unscale_ multiplies every gradient by
// inv_scale and sets found_inf to 1 if any is inf/NaN; _amp_update_scale_
// backs the scale off after an overflow, or grows it after growth_interval
// clean steps.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

Value scalar0d(Builder& b, const Value& v, DType dt) { return b.reshape(b.convert(v, dt), {}); }

std::vector<Value> unscale(LoweringContext& ctx) {
  Builder& b = ctx.b;
  if (!ctx.outputs.empty()) ctx.fail("only the in-place form is supported");
  const Arg& grads = ctx.arg("self");
  const Value& found_inf = ctx.tensor("found_inf");
  Value inv_scale = scalar0d(b, ctx.tensor("inv_scale"), DType::F32);
  Value any_bad = b.constant(Scalar::from_bool(false), DType::Bool);
  for (size_t i = 0; i < grads.tensors.size(); ++i) {
    const Value& g = grads.tensors[i];
    DType acc = math_dtype(g.dtype());
    Value x = b.convert(g, acc);
    // x - x is 0 for finite x and NaN for inf/NaN.
    Value bad = b.compare(Cmp::NE, b.binary("subtract", x, x), splat_like(b, 0, x));
    std::vector<int64_t> all;
    for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
    if (!all.empty()) bad = b.reduce(bad, b.constant(Scalar::from_bool(false), DType::Bool), all, "stablehlo.or");
    any_bad = b.binary("or", any_bad, bad);
    x = b.binary("multiply", x, b.broadcast_to(b.convert(inv_scale, acc), x.shape()));
    ctx.mutate("self", b.convert(x, g.dtype()), static_cast<int>(i));
  }
  Value f = scalar0d(b, found_inf, found_inf.dtype());
  Value updated = b.select(any_bad, b.constant(1.0, found_inf.dtype()), f);
  ctx.mutate("found_inf", b.reshape(updated, found_inf.shape()));
  return {};
}

std::vector<Value> update_scale(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& scale0 = ctx.tensor("self");
  const Value& tracker0 = ctx.tensor("growth_tracker");
  Value scale = scalar0d(b, scale0, DType::F32);
  Value tracker = scalar0d(b, tracker0, DType::I32);
  Value found = b.compare(Cmp::NE, scalar0d(b, ctx.tensor("found_inf"), DType::F32), b.constant(0.0, DType::F32));
  Value growth = b.reshape(ctx.operand("scale_growth_factor", DType::F32), {});
  Value backoff = b.reshape(ctx.operand("scale_backoff_factor", DType::F32), {});
  Value interval = b.constant_int(ctx.to_int("growth_interval", 2000), DType::I32);
  Value zero = b.constant_int(0, DType::I32);
  Value successful = b.binary("add", tracker, b.constant_int(1, DType::I32));
  Value grow = b.compare(Cmp::EQ, successful, interval);
  Value grown = b.binary("multiply", scale, growth);
  Value grown_finite = b.compare(Cmp::EQ, b.binary("subtract", grown, grown), b.constant(0.0, DType::F32));
  Value clean_scale = b.select(b.binary("and", grow, grown_finite), grown, scale);
  Value new_scale = b.select(found, b.binary("multiply", scale, backoff), clean_scale);
  Value new_tracker = b.select(found, zero, b.select(grow, zero, successful));
  new_scale = b.reshape(b.convert(new_scale, scale0.dtype()), scale0.shape());
  new_tracker = b.reshape(b.convert(new_tracker, tracker0.dtype()), tracker0.shape());
  if (ctx.outputs.size() == 2) return {new_scale, new_tracker};  // functional form
  ctx.mutate("growth_tracker", new_tracker);
  return {new_scale};
}

}  // namespace

TORCH_PJRT_LOWERING("_amp_foreach_non_finite_check_and_unscale", unscale);
TORCH_PJRT_LOWERING("_amp_update_scale", update_scale);

}  // namespace torch_pjrt::lowering::ops
