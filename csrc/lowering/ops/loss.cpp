// Loss functions and their backward ops: nll_loss (1-d/2-d), mse, smooth_l1,
// huber, binary_cross_entropy (+ with_logits). cross_entropy, l1_loss and
// kl_div are CompositeImplicitAutograd and decompose into these and
// elementwise ops. Half types are computed in float32 and rounded once, as the
// CPU kernels' opmath does. `reduction` follows at::Reduction: 0 none, 1 mean,
// 2 sum. Of the CPU kernels' checks on data, the target range of nll_loss is
// made in the program (ctx.check_indices); BCE's input in [0, 1] is not.
#include <limits>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

enum Reduction : int64_t { None = 0, Mean = 1, Sum = 2 };

Value sum_all(Builder& b, const Value& x) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) dims.push_back(i);
  return b.reduce(x, b.constant(0.0, x.dtype()), dims, "stablehlo.add");
}

// Applies the reduction to an elementwise loss and rounds to the result type.
Value reduce_loss(Builder& b, const Value& loss, int64_t reduction, const TensorType& out) {
  Value r = loss;
  if (reduction == Sum || reduction == Mean) {
    r = sum_all(b, loss);
    if (reduction == Mean) r = b.binary("divide", r, splat_like(b, double(loss.type.numel()), r));
  }
  return b.reshape(b.convert(r, out.dtype), out.shape);
}

// `name` converted to the math dtype and broadcast to `shape`.
Value input(LoweringContext& ctx, const std::string& name, DType acc, const Shape& shape) {
  return ctx.b.broadcast_to(ctx.b.convert(ctx.tensor(name), acc), shape);
}

// The elementwise shape of a forward loss: the output's shape for reduction
// none, else the broadcast of the operands.
Shape loss_shape(LoweringContext& ctx) {
  return broadcast_shapes(ctx.tensor("self").shape(), ctx.tensor("target").shape());
}

// The factor a backward op applies for the reduction (1/N for mean).
double mean_norm(LoweringContext& ctx) {
  return ctx.to_int("reduction", Mean) == Mean ? 1.0 / double(ctx.tensor("self").type.numel()) : 1.0;
}

// ---- nll_loss ------------------------------------------------------------

// Shared pieces of nll_loss forward/backward. The class dim is 1 for batched
// input (N, C, ...) and 0 for a single sample (C). A one-hot mask over the
// class dim stands in for a gather: it never reads out of range and an
// ignored or out-of-range target simply selects nothing.
struct Nll {
  Value onehot;   // bool, self's shape: class == target
  Value weight;   // acc, target's shape: weight[target], 0 where ignored
  Value valid;    // bool, target's shape: target != ignore_index
  int64_t cdim;
};

Nll nll_common(LoweringContext& ctx, DType acc) {
  Builder& b = ctx.b;
  const Value& self = ctx.tensor("self");
  Value target = b.convert(ctx.tensor("target"), DType::I64);
  Nll n;
  n.cdim = self.rank() == 1 ? 0 : 1;
  target = b.reshape(target, [&] {  // the target's shape is self's without the class dim
    Shape s = self.shape();
    s.erase(s.begin() + n.cdim);
    return s;
  }());
  std::vector<int64_t> other;
  for (int64_t i = 0; i < self.rank(); ++i)
    if (i != n.cdim) other.push_back(i);
  TensorType it{DType::I64, self.shape()};
  n.onehot = b.compare(Cmp::EQ, b.iota(it, n.cdim), b.broadcast_in_dim(target, self.shape(), other));
  n.valid = b.compare(Cmp::NE, target, b.splat(Scalar::from_int(ctx.to_int("ignore_index", -100)),
                                               target.type));
  // A target outside [0, C) that is not ignored (CPU's check).
  ctx.check_indices(b.select(n.valid, target, b.zeros(target.type)), 0, self.shape()[n.cdim],
                    "Target is out of bounds.");
  TensorType wt{acc, target.shape()};
  Value w = b.splat(Scalar::from_float(1.0), wt);
  if (ctx.has("weight")) {
    Value full = b.broadcast_in_dim(b.convert(ctx.tensor("weight"), acc), self.shape(), {n.cdim});
    w = b.reduce(b.select(n.onehot, full, b.zeros({acc, self.shape()})), b.constant(0.0, acc),
                 {n.cdim}, "stablehlo.add");
  }
  n.weight = b.select(n.valid, w, b.zeros(wt));
  return n;
}

// (output, total_weight). total_weight is 0 for reduction none, as on CPU;
// mean over only ignored targets is 0/0 = nan, also as on CPU.
std::vector<Value> nll_loss_forward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out(0).dtype, acc = math_dtype(out);
  Value x = b.convert(ctx.tensor("self"), acc);
  Nll n = nll_common(ctx, acc);
  Value picked = b.reduce(b.select(n.onehot, x, b.zeros(x.type)), b.constant(0.0, acc), {n.cdim},
                          "stablehlo.add");
  Value loss = b.select(n.valid, b.unary("negate", b.binary("multiply", picked, n.weight)),
                        b.zeros(picked.type));
  int64_t reduction = ctx.to_int("reduction", Mean);
  Value total = sum_all(b, n.weight);
  if (reduction == None)
    return {b.reshape(b.convert(loss, out), ctx.out(0).shape), b.zeros(ctx.out(1))};
  Value r = sum_all(b, loss);
  if (reduction == Mean) r = b.binary("divide", r, total);
  return {b.reshape(b.convert(r, out), ctx.out(0).shape),
          b.reshape(b.convert(total, ctx.out(1).dtype), ctx.out(1).shape)};
}

// grad_input[.., target, ..] = -weight[target] * g, zero elsewhere and where
// ignored; g is grad_output (none), its scalar (sum) or scalar/total_weight (mean).
std::vector<Value> nll_loss_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = math_dtype(out);
  const Value& self = ctx.tensor("self");
  Nll n = nll_common(ctx, acc);
  int64_t reduction = ctx.to_int("reduction", Mean);
  Value g = b.convert(ctx.tensor("grad_output"), acc);
  if (reduction == None) {
    g = b.reshape(g, n.weight.shape());
  } else {
    g = b.reshape(g, {});
    if (reduction == Mean)
      g = b.binary("divide", g, b.reshape(b.convert(ctx.tensor("total_weight"), acc), {}));
    g = b.broadcast_in_dim(g, n.weight.shape(), {});
  }
  Value v = b.unary("negate", b.binary("multiply", n.weight, g));
  std::vector<int64_t> other;
  for (int64_t i = 0; i < self.rank(); ++i)
    if (i != n.cdim) other.push_back(i);
  Value mask = b.binary("and", n.onehot, b.broadcast_in_dim(n.valid, self.shape(), other));
  Value grad = b.select(mask, b.broadcast_in_dim(v, self.shape(), other), b.zeros({acc, self.shape()}));
  return {b.convert(grad, out)};
}

// ---- regression losses ---------------------------------------------------

std::vector<Value> mse_loss(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType acc = math_dtype(ctx.out().dtype);
  Shape s = loss_shape(ctx);
  Value d = b.binary("subtract", input(ctx, "self", acc, s), input(ctx, "target", acc, s));
  return {reduce_loss(b, b.binary("multiply", d, d), ctx.to_int("reduction", Mean), ctx.out())};
}

// 2 * (self - target) * grad_output (/ N for mean).
std::vector<Value> mse_loss_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = math_dtype(out);
  const Shape& s = ctx.out().shape;
  Value d = b.binary("subtract", input(ctx, "self", acc, s), input(ctx, "target", acc, s));
  Value g = b.binary("multiply", splat_like(b, 2.0 * mean_norm(ctx), d), d);
  return {b.convert(b.binary("multiply", g, input(ctx, "grad_output", acc, s)), out)};
}

// smooth_l1 (huber = false): |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta
// (beta == 0 is l1); huber: |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta).
std::vector<Value> smooth_l1_huber(LoweringContext& ctx, bool huber) {
  Builder& b = ctx.b;
  DType acc = math_dtype(ctx.out().dtype);
  Shape s = loss_shape(ctx);
  double beta = huber ? ctx.to_double("delta", 1.0) : ctx.to_double("beta", 1.0);
  Value z = b.unary("abs", b.binary("subtract", input(ctx, "self", acc, s), input(ctx, "target", acc, s)));
  Value half_sq = b.binary("multiply", splat_like(b, 0.5, z), b.binary("multiply", z, z));
  Value lin = b.binary("subtract", z, splat_like(b, 0.5 * beta, z));
  Value loss;
  if (huber) {
    loss = b.select(b.compare(Cmp::LT, z, splat_like(b, beta, z)), half_sq,
                    b.binary("multiply", splat_like(b, beta, z), lin));
  } else if (beta == 0) {
    loss = z;
  } else {
    loss = b.select(b.compare(Cmp::LT, z, splat_like(b, beta, z)),
                    b.binary("divide", half_sq, splat_like(b, beta, z)), lin);
  }
  return {reduce_loss(b, loss, ctx.to_int("reduction", Mean), ctx.out())};
}

// The CPU kernels' piecewise derivative, with the same boundary choices
// (d <= -beta, d >= beta): smooth_l1 scales the clamped parts by 1, the middle
// by d / beta; huber scales the clamped parts by delta, the middle by d.
std::vector<Value> smooth_l1_huber_backward(LoweringContext& ctx, bool huber) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = math_dtype(out);
  const Shape& s = ctx.out().shape;
  double beta = huber ? ctx.to_double("delta", 1.0) : ctx.to_double("beta", 1.0);
  Value d = b.binary("subtract", input(ctx, "self", acc, s), input(ctx, "target", acc, s));
  Value g = b.binary("multiply", input(ctx, "grad_output", acc, s), splat_like(b, mean_norm(ctx), d));
  double edge = huber ? beta : 1.0;
  Value hi = b.binary("multiply", g, splat_like(b, edge, d));
  Value lo = b.unary("negate", hi);
  Value mid = huber ? b.binary("multiply", g, d)
                    : b.binary("divide", b.binary("multiply", g, d), splat_like(b, beta, d));
  Value r = b.select(b.compare(Cmp::GE, d, splat_like(b, beta, d)), hi, mid);
  r = b.select(b.compare(Cmp::LE, d, splat_like(b, -beta, d)), lo, r);
  return {b.convert(r, out)};
}

// ---- binary cross entropy ------------------------------------------------

// (target - 1) * max(log1p(-x), -100) - target * max(log(x), -100), times weight.
std::vector<Value> binary_cross_entropy(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType acc = math_dtype(ctx.out().dtype);
  Shape s = loss_shape(ctx);
  Value x = input(ctx, "self", acc, s), t = input(ctx, "target", acc, s);
  // CPU rejects inputs outside [0, 1] (NaN too).
  ctx.check_all(b.binary("and", b.compare(Cmp::GE, x, splat_like(b, 0, x)), b.compare(Cmp::LE, x, splat_like(b, 1, x))),
                "all elements of input should be between 0 and 1", LoweringContext::CheckError::Runtime);
  Value floor = splat_like(b, -100.0, x);
  Value log_x = b.binary("maximum", b.unary("log", x), floor);
  Value log_1mx = b.binary("maximum", b.unary("log_plus_one", b.unary("negate", x)), floor);
  Value loss = b.binary("subtract", b.binary("multiply", b.binary("subtract", t, splat_like(b, 1.0, t)), log_1mx),
                        b.binary("multiply", t, log_x));
  if (ctx.has("weight")) loss = b.binary("multiply", loss, input(ctx, "weight", acc, s));
  return {reduce_loss(b, loss, ctx.to_int("reduction", Mean), ctx.out())};
}

// grad * (x - t) / max((1 - x) x, 1e-12) * weight (/ N for mean).
std::vector<Value> binary_cross_entropy_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype, acc = math_dtype(out);
  const Shape& s = ctx.out().shape;
  Value x = input(ctx, "self", acc, s), t = input(ctx, "target", acc, s);
  Value denom = b.binary("maximum", b.binary("multiply", b.binary("subtract", splat_like(b, 1.0, x), x), x),
                         splat_like(b, 1e-12, x));
  Value g = b.binary("divide", b.binary("subtract", x, t), denom);
  g = b.binary("multiply", g, input(ctx, "grad_output", acc, s));
  if (ctx.has("weight")) g = b.binary("multiply", g, input(ctx, "weight", acc, s));
  double norm = mean_norm(ctx);
  if (norm != 1.0) g = b.binary("multiply", g, splat_like(b, norm, g));
  return {b.convert(g, out)};
}

// (1 - t) x - lw * log_sigmoid(x), lw = 1 + (pos_weight - 1) t, times weight;
// log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) does not overflow.
std::vector<Value> binary_cross_entropy_with_logits(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType acc = math_dtype(ctx.out().dtype);
  Shape s = loss_shape(ctx);
  for (const char* opt : {"weight", "pos_weight"})
    if (ctx.has(opt)) s = broadcast_shapes(s, ctx.tensor(opt).shape());
  Value x = input(ctx, "self", acc, s), t = input(ctx, "target", acc, s);
  Value one = splat_like(b, 1.0, x);
  Value log_sig = b.binary("subtract", b.binary("minimum", x, splat_like(b, 0.0, x)),
                           b.unary("log_plus_one", b.unary("exponential", b.unary("negate", b.unary("abs", x)))));
  if (ctx.has("pos_weight")) {
    Value pw = input(ctx, "pos_weight", acc, s);
    Value lw = b.binary("add", b.binary("multiply", b.binary("subtract", pw, one), t), one);
    log_sig = b.binary("multiply", log_sig, lw);
  }
  Value loss = b.binary("subtract", b.binary("multiply", b.binary("subtract", one, t), x), log_sig);
  if (ctx.has("weight")) loss = b.binary("multiply", loss, input(ctx, "weight", acc, s));
  return {reduce_loss(b, loss, ctx.to_int("reduction", Mean), ctx.out())};
}

}  // namespace

TORCH_PJRT_LOWERING("nll_loss_forward", nll_loss_forward);
TORCH_PJRT_LOWERING("nll_loss_backward", nll_loss_backward);
TORCH_PJRT_LOWERING("nll_loss2d_forward", nll_loss_forward);
TORCH_PJRT_LOWERING("nll_loss2d_backward", nll_loss_backward);
TORCH_PJRT_LOWERING("mse_loss", mse_loss);
TORCH_PJRT_LOWERING("mse_loss_backward", mse_loss_backward);
TORCH_PJRT_LOWERING("smooth_l1_loss", [](LoweringContext& c) { return smooth_l1_huber(c, false); });
TORCH_PJRT_LOWERING("smooth_l1_loss_backward", [](LoweringContext& c) { return smooth_l1_huber_backward(c, false); });
TORCH_PJRT_LOWERING("huber_loss", [](LoweringContext& c) { return smooth_l1_huber(c, true); });
TORCH_PJRT_LOWERING("huber_loss_backward", [](LoweringContext& c) { return smooth_l1_huber_backward(c, true); });
TORCH_PJRT_LOWERING("binary_cross_entropy", binary_cross_entropy);
TORCH_PJRT_LOWERING("binary_cross_entropy_backward", binary_cross_entropy_backward);
TORCH_PJRT_LOWERING("binary_cross_entropy_with_logits", binary_cross_entropy_with_logits);

}  // namespace torch_pjrt::lowering::ops
