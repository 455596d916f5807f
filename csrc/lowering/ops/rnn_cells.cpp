// The fused recurrent cells PyTorch's RNN code (ATen/native/RNN.cpp) calls
// for accelerator inputs: _thnn_fused_lstm_cell, _thnn_fused_gru_cell and
// their backward ops. Elementwise gate math over the precomputed
// input @ W_ih^T and hidden @ W_hh^T products. Outputs and the saved
// workspace have the layout of PyTorch's CUDA kernels, which the backward
// ops read:
//   lstm: workspace [.., 4H] = (i, f, g, o) gates after their activations;
//   gru:  workspace [.., 5H] = (r, z, n, hx, hn + b_hn).
// float16/bfloat16 are computed in float32 and rounded once per result (the
// workspace too), as the CUDA kernels do with their accumulate type.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// Chunk k of n equal chunks of x along its last dim.
Value chunk(Builder& b, const Value& x, int64_t n, int64_t k) {
  Shape start(x.rank(), 0), limit = x.shape();
  int64_t h = x.shape().back() / n;
  start.back() = k * h;
  limit.back() = (k + 1) * h;
  return b.slice(x, start, limit);
}

Value sigmoid(Builder& b, const Value& x) { return b.unary("logistic", x); }
Value add(Builder& b, const Value& x, const Value& y) { return b.binary("add", x, y); }
Value sub(Builder& b, const Value& x, const Value& y) { return b.binary("subtract", x, y); }
Value mul(Builder& b, const Value& x, const Value& y) { return b.binary("multiply", x, y); }
Value one_minus(Builder& b, const Value& x) { return sub(b, splat_like(b, 1, x), x); }

// Tensor `name` in `dt`, or nullopt when absent (an undefined optional tensor).
std::optional<Value> opt_tensor(LoweringContext& ctx, const std::string& name, DType dt) {
  if (!ctx.has(name)) return std::nullopt;
  return ctx.b.convert(ctx.tensor(name), dt);
}

// input_gates + hidden_gates + input_bias + hidden_bias, in `acc`, summed in
// that order (as the kernels do).
struct Gates {
  Value in, hid;
  std::optional<Value> b1, b2;
};
Gates read_gates(LoweringContext& ctx, DType acc) {
  Builder& b = ctx.b;
  Gates g{b.convert(ctx.tensor("input_gates"), acc), b.convert(ctx.tensor("hidden_gates"), acc),
          opt_tensor(ctx, "input_bias", acc), opt_tensor(ctx, "hidden_bias", acc)};
  const Shape& s = g.in.shape();
  if (g.b1) g.b1 = b.broadcast_to(*g.b1, s);
  if (g.b2) g.b2 = b.broadcast_to(*g.b2, s);
  return g;
}

std::vector<Value> fused_lstm_cell(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out(0).dtype, acc = math_dtype(out);
  Gates g = read_gates(ctx, acc);
  Value cx = b.convert(ctx.tensor("cx"), acc);
  Value pre = add(b, g.in, g.hid);
  if (g.b1) pre = add(b, pre, *g.b1);
  if (g.b2) pre = add(b, pre, *g.b2);
  Value ig = sigmoid(b, chunk(b, pre, 4, 0));
  Value fg = sigmoid(b, chunk(b, pre, 4, 1));
  Value cg = b.unary("tanh", chunk(b, pre, 4, 2));
  Value og = sigmoid(b, chunk(b, pre, 4, 3));
  Value cy = add(b, mul(b, fg, cx), mul(b, ig, cg));
  Value hy = mul(b, og, b.unary("tanh", cy));
  Value ws = b.concatenate({ig, fg, cg, og}, ig.rank() - 1);
  return {b.convert(hy, out), b.convert(cy, out), b.convert(ws, ctx.out(2).dtype)};
}

// (grad_gates, grad_cx, grad_bias); grad_bias = grad_gates summed over the
// batch when has_bias. Both grads absent: every result is undefined.
std::vector<Value> fused_lstm_cell_backward_impl(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value ws_in = ctx.tensor("workspace");
  DType out = ws_in.dtype(), acc = math_dtype(out);
  if (!ctx.has("grad_hy") && !ctx.has("grad_cy")) {
    // Undefined results (the meta kernel returned None): placeholders, dropped.
    std::vector<Value> r;
    for (const auto& t : ctx.outputs) r.push_back(b.zeros(t));
    return r;
  }
  Value ws = b.convert(ws_in, acc);
  Value cx = b.convert(ctx.tensor("cx"), acc);
  Value cy = b.convert(ctx.tensor("cy"), acc);
  Value zero = b.zeros(cx.type);
  Value go = ctx.has("grad_hy") ? b.convert(ctx.tensor("grad_hy"), acc) : zero;
  Value goc = ctx.has("grad_cy") ? b.convert(ctx.tensor("grad_cy"), acc) : zero;
  Value ig = chunk(b, ws, 4, 0), fg = chunk(b, ws, 4, 1);
  Value cg = chunk(b, ws, 4, 2), og = chunk(b, ws, 4, 3);
  Value tcy = b.unary("tanh", cy);
  Value gog = mul(b, go, tcy);
  Value gcx = add(b, mul(b, mul(b, go, og), one_minus(b, mul(b, tcy, tcy))), goc);
  Value gig = mul(b, gcx, cg);
  Value gfg = mul(b, gcx, cx);
  Value gcg = mul(b, gcx, ig);
  gcx = mul(b, gcx, fg);
  gig = mul(b, mul(b, gig, one_minus(b, ig)), ig);
  gfg = mul(b, mul(b, gfg, one_minus(b, fg)), fg);
  gcg = mul(b, gcg, one_minus(b, mul(b, cg, cg)));
  gog = mul(b, mul(b, gog, one_minus(b, og)), og);
  Value grad_gates = b.convert(b.concatenate({gig, gfg, gcg, gog}, ig.rank() - 1), out);
  std::vector<Value> r{grad_gates, b.convert(gcx, ctx.out(1).dtype)};
  if (ctx.to_bool("has_bias", false)) {
    // The sum of the rounded grad_gates, as PyTorch's grad_gates.sum(0).
    Value s = b.reduce(b.convert(grad_gates, acc), b.constant(0.0, acc), {0}, "stablehlo.add");
    r.push_back(b.convert(s, ctx.out(2).dtype));
  } else {
    r.push_back(b.zeros(ctx.out(2)));
  }
  return r;
}

std::vector<Value> fused_gru_cell(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out(0).dtype, acc = math_dtype(out);
  Gates g = read_gates(ctx, acc);
  Value hx = b.convert(ctx.tensor("hx"), acc);
  auto part = [&](const Value& v, int k) { return chunk(b, v, 3, k); };
  Value r_pre = add(b, part(g.in, 0), part(g.hid, 0));
  Value z_pre = add(b, part(g.in, 1), part(g.hid, 1));
  Value n_in = part(g.in, 2), hn = part(g.hid, 2);
  if (g.b1) {
    r_pre = add(b, r_pre, part(*g.b1, 0));
    z_pre = add(b, z_pre, part(*g.b1, 1));
    n_in = add(b, n_in, part(*g.b1, 2));
  }
  if (g.b2) {
    r_pre = add(b, r_pre, part(*g.b2, 0));
    z_pre = add(b, z_pre, part(*g.b2, 1));
    hn = add(b, hn, part(*g.b2, 2));
  }
  Value rg = sigmoid(b, r_pre), ig = sigmoid(b, z_pre);
  Value ng = b.unary("tanh", add(b, n_in, mul(b, rg, hn)));
  Value hy = add(b, ng, mul(b, ig, sub(b, hx, ng)));
  Value ws = b.concatenate({rg, ig, ng, hx, hn}, rg.rank() - 1);
  return {b.convert(hy, out), b.convert(ws, ctx.out(1).dtype)};
}

// (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::vector<Value> fused_gru_cell_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Value ws_in = ctx.tensor("workspace");
  DType out = ws_in.dtype(), acc = math_dtype(out);
  Value ws = b.convert(ws_in, acc);
  Value go = b.convert(ctx.tensor("grad_hy"), acc);
  auto part = [&](int k) { return chunk(b, ws, 5, k); };
  Value rg = part(0), ig = part(1), ng = part(2), hx = part(3), hn = part(4);
  Value gig = mul(b, mul(b, mul(b, go, sub(b, hx, ng)), one_minus(b, ig)), ig);
  Value ghx = mul(b, go, ig);
  Value gin = mul(b, mul(b, go, one_minus(b, ig)), one_minus(b, mul(b, ng, ng)));
  Value ghn = mul(b, gin, rg);
  Value grg = mul(b, mul(b, mul(b, gin, hn), one_minus(b, rg)), rg);
  int64_t last = rg.rank() - 1;
  Value gi = b.convert(b.concatenate({grg, gig, gin}, last), out);
  Value gh = b.convert(b.concatenate({grg, gig, ghn}, last), out);
  std::vector<Value> r{gi, gh, b.convert(ghx, ctx.out(2).dtype)};
  bool has_bias = ctx.to_bool("has_bias", false);
  for (int k = 0; k < 2; ++k) {
    const TensorType& t = ctx.out(3 + k);
    if (has_bias) {
      Value s = b.reduce(b.convert(k == 0 ? gi : gh, acc), b.constant(0.0, acc), {0}, "stablehlo.add");
      r.push_back(b.convert(s, t.dtype));
    } else {
      r.push_back(b.zeros(t));
    }
  }
  return r;
}

}  // namespace

TORCH_PJRT_LOWERING("_thnn_fused_lstm_cell", fused_lstm_cell);
TORCH_PJRT_LOWERING("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward_impl);
TORCH_PJRT_LOWERING("_thnn_fused_gru_cell", fused_gru_cell);
TORCH_PJRT_LOWERING("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);

}  // namespace torch_pjrt::lowering::ops
