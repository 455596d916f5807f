// Batch normalization, forward and backward. nn.BatchNorm* reaches
// native_batch_norm (batch_norm and _batch_norm_impl_index are
// CompositeImplicitAutograd; the cudnn/miopen variants are not for us) and its
// autograd formula calls native_batch_norm_backward. Statistics are computed in
// float32 for half inputs and in the input's type otherwise; the formulas follow
// PyTorch's CPU kernels (aten/src/ATen/native/Normalization.cpp).
#include <string>
#include <utility>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

DType acc_dtype(DType t) { return is_float(t) && itemsize(t) < 4 ? DType::F32 : t; }

// Dims reduced per channel: all but dim 1.
std::vector<int64_t> reduce_dims(int64_t rank) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  return dims;
}

// A per-channel [C] value broadcast along dim 1 of `shape`.
Value per_channel(Builder& b, const Value& v, const Shape& shape) {
  return b.broadcast_in_dim(v, shape, {1});
}

Value channel_sum(Builder& b, const Value& x) {
  return b.reduce(x, b.constant(0.0, x.dtype()), reduce_dims(x.rank()), "stablehlo.add");
}

// A [C] per-channel tensor argument in `acc`. The aten op's Meta kernel does
// not check its size (CPU's kernel reads what it finds; torch.batch_norm
// checks first, with this message).
Value channel_tensor(LoweringContext& ctx, const std::string& name, DType acc, int64_t c) {
  const Value& v = ctx.tensor(name);
  if (v.rank() != 1 || v.shape()[0] != c)
    ctx.fail(name + " should contain " + std::to_string(c) + " elements (a 1-d tensor), not " +
             std::to_string(v.type.numel()) + " in " + std::to_string(v.rank()) + " dims");
  return ctx.b.convert(v, acc);
}

// A [C] optional parameter in `acc`, or `dflt` when absent.
Value param_or(LoweringContext& ctx, const std::string& name, DType acc, int64_t c, double dflt) {
  if (ctx.has(name)) return channel_tensor(ctx, name, acc, c);
  return ctx.b.splat(Scalar::from_float(dflt), TensorType{acc, {c}});
}

// The per-sample count n = numel / C as a float constant.
double per_channel_count(const Value& x) {
  return x.shape()[1] == 0 ? 0.0 : double(x.type.numel() / x.shape()[1]);
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training,
// momentum, eps) -> (out, save_mean, save_invstd). Training updates the running
// stats in place with the unbiased variance, as the CPU kernel does; eval returns
// the running mean and its invstd as the saved statistics (the CUDA convention:
// CPU returns empty tensors there, the Meta kernel gives [C]).
std::vector<Value> native_batch_norm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  if (input.rank() < 2) ctx.fail("native_batch_norm: input must have at least 2 dims");
  DType acc = acc_dtype(input.dtype());
  const Shape& shape = input.shape();
  int64_t c = shape[1];
  Value x = b.convert(input, acc);
  Value eps = b.broadcast_to(ctx.operand("eps", acc), {c});
  Value one = b.splat(Scalar::from_float(1.0), TensorType{acc, {c}});
  Value mean, invstd;
  if (ctx.to_bool("training", false)) {
    double n = per_channel_count(input);
    Value nv = b.splat(Scalar::from_float(n), TensorType{acc, {c}});
    mean = b.binary("divide", channel_sum(b, x), nv);
    Value centered = b.binary("subtract", x, per_channel(b, mean, shape));
    Value var_sum = channel_sum(b, b.binary("multiply", centered, centered));
    invstd = b.unary("rsqrt", b.binary("add", b.binary("divide", var_sum, nv), eps));
    Value momentum = b.broadcast_to(ctx.operand("momentum", acc), {c});
    Value keep = b.binary("subtract", one, momentum);
    auto blend = [&](const std::string& name, const Value& stat) {
      const Value& old = ctx.tensor(name);
      Value v = b.binary("add", b.binary("multiply", momentum, stat),
                         b.binary("multiply", keep, channel_tensor(ctx, name, acc, c)));
      ctx.mutate(name, b.convert(v, old.dtype()));
    };
    if (ctx.has("running_mean")) blend("running_mean", mean);
    if (ctx.has("running_var")) {
      Value nm1 = b.splat(Scalar::from_float(n - 1), TensorType{acc, {c}});
      blend("running_var", b.binary("divide", var_sum, nm1));
    }
  } else {
    // The Meta kernel has already rejected eval mode without running stats.
    mean = channel_tensor(ctx, "running_mean", acc, c);
    invstd = b.unary("rsqrt", b.binary("add", channel_tensor(ctx, "running_var", acc, c), eps));
  }
  // out = x * alpha + beta with alpha = invstd * w, beta = b - mean * alpha, as on CPU.
  Value alpha = b.binary("multiply", invstd, param_or(ctx, "weight", acc, c, 1.0));
  Value beta = b.binary("subtract", param_or(ctx, "bias", acc, c, 0.0), b.binary("multiply", mean, alpha));
  Value out = b.binary("add", b.binary("multiply", x, per_channel(b, alpha, shape)), per_channel(b, beta, shape));
  return {out, mean, invstd};
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
// save_mean?, save_invstd?, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias).
std::vector<Value> native_batch_norm_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& input = ctx.tensor("input");
  DType acc = acc_dtype(input.dtype());
  const Shape& shape = input.shape();
  int64_t c = shape[1];
  Value x = b.convert(input, acc);
  Value dy = b.convert(ctx.tensor("grad_out"), acc);
  bool train = ctx.to_bool("train", false);
  Value mean, invstd;
  if (train) {
    mean = channel_tensor(ctx, "save_mean", acc, c);
    invstd = channel_tensor(ctx, "save_invstd", acc, c);
  } else {
    mean = channel_tensor(ctx, "running_mean", acc, c);
    Value eps = b.broadcast_to(ctx.operand("eps", acc), {c});
    invstd = b.unary("rsqrt", b.binary("add", channel_tensor(ctx, "running_var", acc, c), eps));
  }
  Value w = param_or(ctx, "weight", acc, c, 1.0);
  Value sum = channel_sum(b, dy);
  Value centered = b.binary("subtract", x, per_channel(b, mean, shape));
  Value dotp = channel_sum(b, b.binary("multiply", centered, dy));
  Value scale = per_channel(b, b.binary("multiply", invstd, w), shape);
  Value grad_input;
  if (train) {
    Value nv = b.splat(Scalar::from_float(per_channel_count(input)), TensorType{acc, {c}});
    // k = dotp * invstd^2 / n projects out the variance direction; grad_mean = sum / n.
    Value k = b.binary("divide", b.binary("multiply", dotp, b.binary("multiply", invstd, invstd)), nv);
    Value grad_mean = b.binary("divide", sum, nv);
    Value g = b.binary("subtract", dy, b.binary("multiply", centered, per_channel(b, k, shape)));
    g = b.binary("subtract", g, per_channel(b, grad_mean, shape));
    grad_input = b.binary("multiply", g, scale);
  } else {
    grad_input = b.binary("multiply", dy, scale);
  }
  // All three: the executor drops the ones output_mask did not ask for.
  return {grad_input, b.binary("multiply", dotp, invstd), sum};
}

// The functional forms AOTAutograd leaves in graphs: the updated running
// stats are results instead of writes (no_training: eval mode, no update).
std::vector<Value> batch_norm_functional(LoweringContext& ctx) {
  std::vector<Value> out = native_batch_norm(ctx);
  for (const char* name : {"running_mean", "running_var"}) {
    Value v = ctx.tensor(name);
    for (const auto& m : ctx.mutations)
      if (m.name == name) v = m.value;
    out.push_back(v);
  }
  ctx.mutations.clear();
  return out;
}

// What export's training IR calls (and its functionalized form):
// _batch_norm_with_update is native_batch_norm in training mode,
// _batch_norm_no_update in eval mode; each also returns `reserve`, an empty
// byte tensor (cuDNN's workspace elsewhere). batch_norm_backward is
// native_batch_norm_backward with save_var (the saved invstd) and `update`.
void set_bool(LoweringContext& ctx, const std::string& name, bool value) {
  Arg a;
  a.kind = Arg::Bool;
  a.name = name;
  a.scalar = Scalar::from_bool(value);
  ctx.args.push_back(a);
}

LowerFn batch_norm_update(bool update, bool functional) {
  return [update, functional](LoweringContext& ctx) {
    set_bool(ctx, "training", update);
    std::vector<Value> out = functional ? batch_norm_functional(ctx) : native_batch_norm(ctx);
    out.insert(out.begin() + 3, ctx.b.zeros(ctx.out(3)));
    // (Where the Meta function failed (a None weight in eval mode), CPU's
    // results stand for it: empty saved statistics.)
    for (size_t i : {1, 2})
      if (ctx.out(i).numel() == 0) out[i] = ctx.b.zeros(ctx.out(i));
    return out;
  };
}

std::vector<Value> batch_norm_backward(LoweringContext& ctx) {
  for (Arg& a : ctx.args) {
    if (a.name == "save_var") a.name = "save_invstd";
    if (a.name == "update") a.name = "train";
  }
  return native_batch_norm_backward(ctx);
}

}  // namespace

TORCH_PJRT_LOWERING("_batch_norm_with_update", batch_norm_update(true, false));
TORCH_PJRT_LOWERING("_batch_norm_with_update_functional", batch_norm_update(true, true));
TORCH_PJRT_LOWERING("_batch_norm_no_update", batch_norm_update(false, false));
TORCH_PJRT_LOWERING("batch_norm_backward", batch_norm_backward);
TORCH_PJRT_LOWERING("_native_batch_norm_legit_functional", batch_norm_functional);
// Eval mode: "training" is absent, so the lowering reads it as false.
TORCH_PJRT_LOWERING("_native_batch_norm_legit_no_training", native_batch_norm);
TORCH_PJRT_LOWERING("native_batch_norm", native_batch_norm);
// (and .no_stats: training without running stats) what exported programs call
TORCH_PJRT_LOWERING("_native_batch_norm_legit", native_batch_norm);
TORCH_PJRT_LOWERING("native_batch_norm_backward", native_batch_norm_backward);

}  // namespace torch_pjrt::lowering::ops
