// Attention.
//
// F.scaled_dot_product_attention on tpu takes the fused "overrideable" op for
// 4-d inputs with equal head counts (device/attention_choice.cpp registers the
// _fused_sdp_choice stub); other shapes take PyTorch's math path
// (_scaled_dot_product_attention_math, CompositeImplicitAutograd: mul, bmm,
// add, native_dropout, _safe_softmax).
// Lowered here:
//  - _safe_softmax (used by SDPA's math path): softmax, except rows that
//    are entirely -inf (fully masked queries) give 0 instead of NaN. Its
//    backward is _softmax_backward_data on the result.
//  - _scaled_dot_product_fused_attention_overrideable and its _backward: the
//    whole attention as one program each.
#include <cmath>
#include <limits>

#include "lowering/ops/common.h"
#include "lowering/ops/random_bits.h"

namespace torch_pjrt::lowering::ops {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

std::vector<Value> safe_softmax(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value self = ctx.tensor("self");
  if (out.numel() == 0) return {b.zeros(out)};
  // dtype= converts the input first; half types are computed in float32.
  DType acc = math_dtype(out.dtype);
  Value x = b.convert(b.convert(self, out.dtype), acc);
  if (x.rank() == 0) x = b.reshape(x, {1});
  int64_t dim = wrap_dim(ctx.to_int("dim", -1), x.rank());
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) kept.push_back(i);
  auto spread = [&](const Value& r) { return b.broadcast_in_dim(r, x.shape(), kept); };
  Value m = spread(b.reduce(x, b.constant(-kInf, acc), {dim}, "stablehlo.maximum"));
  Value e = b.unary("exponential", b.binary("subtract", x, m));
  Value p = b.binary("divide", e, spread(b.reduce(e, b.constant(0.0, acc), {dim}, "stablehlo.add")));
  // A row is masked when every entry is -inf.
  Value neg_inf = b.compare(Cmp::EQ, x, splat_like(b, -kInf, x));
  Value masked =
      spread(b.reduce(neg_inf, b.constant(Scalar::from_bool(true), DType::Bool), {dim}, "stablehlo.and"));
  p = b.select(masked, splat_like(b, 0.0, p), p);
  return {b.reshape(b.convert(p, out.dtype), out.shape)};
}

// ---- fused attention ------------------------------------------------------------------
//
// Computed in float32 for half inputs, like the math path. The dropout mask
// comes from Threefry-2x32 keyed by the executor's random state, which the
// forward returns as (philox_seed, philox_offset) so that the backward
// regenerates the same mask (ops/random_bits.h).

// The dropout scale of `shape` from the i64[2] key: 1/(1-p) where kept
// (probability 1-p, as bernoulli(1-p)), else 0.
Value dropout_scale(Builder& b, const Value& key, const Shape& shape, double p) {
  Value u = uniform01(b, key, numel(shape));
  Value keep = b.reshape(b.compare(Cmp::LT, u, b.splat(Scalar::from_float(1.0 - p), u.type)), shape);
  TensorType ft{DType::F32, shape};
  return b.select(keep, b.splat(Scalar::from_float(1.0 / (1.0 - p)), ft), b.zeros(ft));
}

struct Attn {
  Value q, k, v;      // acc dtype, [..., L, E] / [..., S, E] / [..., S, Ev]
  Value p;            // softmax probabilities [..., L, S], 0 in fully masked rows
  Value lse;          // logsumexp over S [..., L]; -inf in fully masked rows
  double scale;
  std::vector<int64_t> batch;  // leading dims
};

// q @ k^T * scale (+ causal mask, + bias) and its safe softmax.
Attn attention_probs(LoweringContext& ctx) {
  Builder& b = ctx.b;
  Attn a;
  DType acc = math_dtype(ctx.tensor("query").dtype());
  a.q = b.convert(ctx.tensor("query"), acc);
  a.k = b.convert(ctx.tensor("key"), acc);
  a.v = b.convert(ctx.tensor("value"), acc);
  int64_t r = a.q.rank();
  if (a.k.rank() != r || a.v.rank() != r || r < 2)
    ctx.fail("query, key and value must have the same rank >= 2");
  for (int64_t i = 0; i < r - 2; ++i) {
    if (a.k.shape()[i] != a.q.shape()[i] || a.v.shape()[i] != a.q.shape()[i])
      ctx.fail("query, key and value must have the same batch and head sizes (no grouped-query broadcast)");
    a.batch.push_back(i);
  }
  int64_t E = a.q.shape()[r - 1];
  a.scale = ctx.has("scale") ? ctx.to_double("scale", 1.0) : 1.0 / std::sqrt(double(E));
  Value s = b.dot_general(a.q, a.k, a.batch, a.batch, {r - 1}, {r - 1}, acc);
  s = b.binary("multiply", s, splat_like(b, a.scale, s));
  if (ctx.to_bool("is_causal", false)) {
    // Top-left aligned lower triangle, as tril(ones(L, S)).
    TensorType it{DType::I64, s.shape()};
    Value above = b.compare(Cmp::GT, b.iota(it, r - 1), b.iota(it, r - 2));
    s = b.select(above, splat_like(b, -kInf, s), s);
  }
  if (ctx.has("attn_bias")) {
    Value bias = ctx.tensor("attn_bias");
    // The op's Meta function does not check the mask's shape: CPU's math
    // path's error (scores + mask), not the builder's.
    const Shape &ss = s.shape(), &bs = bias.shape();
    if (bs.size() > ss.size()) ctx.fail("attn_mask has more dims than the attention scores");
    for (size_t i = 1; i <= bs.size(); ++i) {
      int64_t sa = ss[ss.size() - i], sb = bs[bs.size() - i];
      if (sb != 1 && sb != sa)
        ctx.fail("The size of tensor a (" + std::to_string(sa) + ") must match the size of tensor b (" +
                 std::to_string(sb) + ") at non-singleton dimension " + std::to_string(ss.size() - i));
    }
    TensorType bt{acc, bias.shape()};
    bias = bias.dtype() == DType::Bool ? b.select(bias, b.zeros(bt), b.splat(Scalar::from_float(-kInf), bt))
                                       : b.convert(bias, acc);
    s = b.binary("add", s, b.broadcast_to(bias, s.shape()));
  }
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < r - 1; ++i) kept.push_back(i);
  auto spread = [&](const Value& x) { return b.broadcast_in_dim(x, s.shape(), kept); };
  Value m = b.reduce(s, b.constant(-kInf, acc), {r - 1}, "stablehlo.maximum");
  Value masked = b.compare(Cmp::EQ, m, splat_like(b, -kInf, m));
  m = b.select(masked, splat_like(b, 0.0, m), m);
  Value e = b.unary("exponential", b.binary("subtract", s, spread(m)));
  Value sum = b.reduce(e, b.constant(0.0, acc), {r - 1}, "stablehlo.add");
  a.p = b.binary("divide", e, spread(sum));
  a.p = b.select(spread(masked), splat_like(b, 0.0, a.p), a.p);
  a.lse = b.binary("add", m, b.unary("log", sum));  // log(0) = -inf in masked rows
  return a;
}

// The i64[2] random key from the philox_seed / philox_offset 0-d tensors.
Value key_from(Builder& b, const Value& seed, const Value& offset) {
  auto word = [&](const Value& v) { return b.reshape(b.convert(v, DType::I64), {1}); };
  return b.concatenate({word(seed), word(offset)}, 0);
}

std::vector<Value> fused_attention(LoweringContext& ctx) {
  Builder::PrecisionCap cap(ctx.b, ctx.tensor("query").dtype());
  Builder& b = ctx.b;
  Attn a = attention_probs(ctx);
  int64_t r = a.q.rank();
  double p = ctx.to_double("dropout_p", 0.0);
  Value probs = a.p;
  if (!ctx.rng_state) ctx.fail("fused attention lowering without a random state");
  Value key = *ctx.rng_state;
  if (p > 0)
    probs = b.binary("multiply", probs, b.convert(dropout_scale(b, key, probs.shape(), p), probs.dtype()));
  Value out = b.dot_general(probs, a.v, a.batch, a.batch, {r - 1}, {r - 2}, probs.dtype());
  auto seed = b.reshape(b.slice(key, {0}, {1}), {}), offset = b.reshape(b.slice(key, {1}, {2}), {});
  int64_t L = a.q.shape()[r - 2], S = a.k.shape()[r - 2];
  std::vector<Value> res{b.convert(out, ctx.out(0).dtype), b.reshape(a.lse, ctx.out(1).shape),
                         b.zeros(ctx.out(2)), b.zeros(ctx.out(3)),
                         b.constant_int(L, DType::I64), b.constant_int(S, DType::I64), seed, offset,
                         b.zeros(ctx.out(8))};
  // cum_seq_q/k and debug_attn_mask are None (Meta says so): placeholders the executor drops.
  return res;
}

std::vector<Value> fused_attention_backward(LoweringContext& ctx) {
  Builder::PrecisionCap cap(ctx.b, ctx.tensor("query").dtype());
  Builder& b = ctx.b;
  Attn a = attention_probs(ctx);
  int64_t r = a.q.rank();
  DType acc = a.q.dtype();
  Value g = b.convert(ctx.tensor("grad_out"), acc);
  double p = ctx.to_double("dropout_p", 0.0);
  Value probs = a.p, drop;
  if (p > 0) {
    drop = b.convert(dropout_scale(b, key_from(b, ctx.tensor("philox_seed"), ctx.tensor("philox_offset")),
                                   probs.shape(), p), acc);
    probs = b.binary("multiply", probs, drop);
  }
  std::vector<int64_t> bd = a.batch;
  // dV = probs^T dO; d(probs) = dO V^T.
  Value dv = b.dot_general(probs, g, bd, bd, {r - 2}, {r - 2}, acc);
  Value dp = b.dot_general(g, a.v, bd, bd, {r - 1}, {r - 1}, acc);
  if (p > 0) dp = b.binary("multiply", dp, drop);
  // Softmax backward: dS = P * (dP - sum(dP * P)).
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < r - 1; ++i) kept.push_back(i);
  Value rowsum = b.reduce(b.binary("multiply", dp, a.p), b.constant(0.0, acc), {r - 1}, "stablehlo.add");
  Value ds = b.binary("multiply", a.p, b.binary("subtract", dp, b.broadcast_in_dim(rowsum, dp.shape(), kept)));
  Value dss = b.binary("multiply", ds, splat_like(b, a.scale, ds));
  Value dq = b.dot_general(dss, a.k, bd, bd, {r - 1}, {r - 2}, acc);
  Value dk = b.dot_general(dss, a.q, bd, bd, {r - 2}, {r - 2}, acc);
  std::vector<Value> res{b.convert(dq, ctx.out(0).dtype), b.convert(dk, ctx.out(1).dtype),
                         b.convert(dv, ctx.out(2).dtype)};
  // The bias gradient is dS summed over the dims the bias was broadcast along.
  const TensorType& bt = ctx.out(3);
  if (ctx.has("attn_bias") && bt.shape == ctx.tensor("attn_bias").shape() && bt.numel() > 0) {
    int64_t lead = ds.rank() - bt.rank();
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < ds.rank(); ++i)
      if (i < lead || bt.shape[i - lead] == 1) dims.push_back(i);
    Value gb = dims.empty() ? ds : b.reduce(ds, b.constant(0.0, acc), dims, "stablehlo.add");
    res.push_back(b.convert(b.reshape(gb, bt.shape), bt.dtype));
  } else {
    res.push_back(b.zeros(bt));
  }
  return res;
}

}  // namespace

TORCH_PJRT_LOWERING("_safe_softmax", safe_softmax);
TORCH_PJRT_LOWERING("_scaled_dot_product_fused_attention_overrideable", fused_attention, /*needs_rng=*/true);
TORCH_PJRT_LOWERING("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_backward);

}  // namespace torch_pjrt::lowering::ops
