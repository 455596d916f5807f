// Fused optimizer steps (_fused_adam_, _fused_adamw_, _fused_sgd_,
// _fused_adagrad_): the whole update of every parameter in one program, with
// the same arithmetic as PyTorch's CPU fused kernels (opmath: float32 for half
// types; bias corrections in float64). Hyper-parameters are runtime scalars,
// so a learning-rate schedule compiles nothing new. Every list is written back
// with ctx.mutate (the .out overloads: `out` only, see update()).
#include <functional>
#include <map>
#include <utility>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// A float argument as a 0-d value of `dt` (runtime input or constant), or a
// 0-d/1-element tensor argument (the tensor_lr overloads).
Value hyper(LoweringContext& ctx, const std::string& name, DType dt) {
  const Arg& a = ctx.arg(name);
  if (a.kind == Arg::Tensor) return ctx.b.reshape(ctx.b.convert(a.tensor, dt), {});
  return ctx.b.reshape(ctx.operand(name, dt), {});
}

// hyper() and scaling() once per (name, dtype), not once per parameter: the
// program reads each runtime scalar once.
class Hypers {
 public:
  explicit Hypers(LoweringContext& ctx) : ctx_(ctx) {}
  Value operator()(const std::string& name, DType dt) {
    auto key = std::make_pair(name, dt);
    auto it = values_.find(key);
    if (it == values_.end()) it = values_.emplace(key, hyper(ctx_, name, dt)).first;
    return it->second;
  }

 private:
  LoweringContext& ctx_;
  std::map<std::pair<std::string, DType>, Value> values_;
};

// Is the float argument possibly nonzero? Runtime values are assumed to be.
bool maybe_nonzero(const LoweringContext& ctx, const std::string& name) {
  const Arg& a = ctx.arg(name);
  return a.dynamic || a.scalar.to_double() != 0.0;
}

Value full(Builder& b, const Value& scalar0d, const Value& like) {
  return b.broadcast_to(b.convert(scalar0d, like.dtype()), like.shape());
}

const Value& element(const LoweringContext& ctx, const std::string& list, size_t i) {
  const Arg& a = ctx.arg(list);
  if (a.kind != Arg::TensorList || i >= a.tensors.size()) ctx.fail("'" + list + "' has too few tensors");
  return a.tensors[i];
}

// grad / grad_scale (written back, as the CPU kernel does) and the found_inf
// predicate that turns the whole step into a no-op.
struct Scaling {
  std::optional<Value> inv_scale, skip;
};

Scaling scaling(LoweringContext& ctx, DType opmath) {
  Scaling s;
  Builder& b = ctx.b;
  if (ctx.has("grad_scale"))
    s.inv_scale = b.binary("divide", b.constant(1.0, opmath),
                           b.reshape(b.convert(ctx.tensor("grad_scale"), opmath), {}));
  if (ctx.has("found_inf"))
    s.skip = b.compare(Cmp::NE, b.reshape(b.convert(ctx.tensor("found_inf"), DType::F32), {}),
                       b.constant(0.0, DType::F32));
  return s;
}

// Writes `fresh` into list element i (or keeps `old` when found_inf is set).
// The .out overloads write `out` only: CPU's kernel leaves the state lists (annotated
// as written) as they were.
void update(LoweringContext& ctx, const Scaling& s, const std::string& list, size_t i, const Value& old,
            Value fresh) {
  if (list != "out" && ctx.has("out")) return;
  Builder& b = ctx.b;
  fresh = b.convert(fresh, old.dtype());
  if (s.skip) fresh = b.select(b.broadcast_to(*s.skip, old.shape()), old, fresh);
  ctx.mutate(list, fresh, static_cast<int>(i));
}

// Where the new parameters go: self for the in-place ops; `out` for the .out
// overloads, whose self is read-only.
const char* params_out(const LoweringContext& ctx) { return ctx.has("out") ? "out" : "self"; }

Value grad_of(LoweringContext& ctx, const Scaling& s, size_t i, DType opmath) {
  Builder& b = ctx.b;
  const Value& g0 = element(ctx, "grads", i);
  Value g = b.convert(g0, opmath);
  if (s.inv_scale) {
    g = b.binary("multiply", g, full(b, *s.inv_scale, g));
    update(ctx, s, "grads", i, g0, g);
  }
  if (ctx.to_bool("maximize", false)) g = b.unary("negate", g);
  return g;
}

// One parameter: its index, stored value, math type and that type's scaling,
// and the parameter and its gradient (unscaled, negated for maximize) in it.
struct Param {
  size_t i;
  const Value& p0;
  DType opmath;
  const Scaling& s;
  Value p, g;
};

// Runs `step` for each parameter and writes the new parameter it returns.
void for_each_param(LoweringContext& ctx, const std::function<Value(const Param&)>& step) {
  const Arg& params = ctx.arg("self");
  std::map<DType, Scaling> scalings;
  for (size_t i = 0; i < params.tensors.size(); ++i) {
    const Value& p0 = params.tensors[i];
    DType opmath = math_dtype(p0.dtype());
    if (!scalings.count(opmath)) scalings[opmath] = scaling(ctx, opmath);
    const Scaling& s = scalings[opmath];
    Param x{i, p0, opmath, s, ctx.b.convert(p0, opmath), grad_of(ctx, s, i, opmath)};
    update(ctx, s, params_out(ctx), i, p0, step(x));
  }
}

LowerFn adam(bool decoupled_weight_decay) {
  return [decoupled_weight_decay](LoweringContext& ctx) -> std::vector<Value> {
    Builder& b = ctx.b;
    bool amsgrad = ctx.to_bool("amsgrad", false);
    bool weight_decay = maybe_nonzero(ctx, "weight_decay");
    Hypers hp(ctx);
    for_each_param(ctx, [&](const Param& x) {
      DType opmath = x.opmath;
      Value p = x.p, g = x.g;
      Value beta2 = hp("beta2", opmath), eps = hp("eps", opmath);
      Value one64 = b.constant(1.0, DType::F64);
      if (weight_decay) {
        if (decoupled_weight_decay) {  // AdamW: param *= 1 - lr * wd, the factor in float64 as on CPU
          Value keep = b.binary("subtract", one64,
                                b.binary("multiply", hp("lr", DType::F64), hp("weight_decay", DType::F64)));
          p = b.binary("multiply", p, full(b, keep, p));
        } else {
          g = b.binary("add", g, b.binary("multiply", p, full(b, hp("weight_decay", opmath), p)));
        }
      }
      // 1 - beta in float64, then rounded (as CPU's kernel): 1 - f32(0.99999)
      // is 1.36e-3 off 1e-5, against the bias correction's float64 beta2.
      auto complement = [&](const char* name) {
        return b.convert(b.binary("subtract", one64, hp(name, DType::F64)), opmath);
      };
      const Value& m0 = element(ctx, "exp_avgs", x.i);
      const Value& v0 = element(ctx, "exp_avg_sqs", x.i);
      // exp_avg = lerp(exp_avg, grad, 1 - beta1); exp_avg_sq = beta2 * v + (1 - beta2) * g^2
      Value m = b.convert(m0, opmath);
      m = b.binary("add", m, b.binary("multiply", full(b, complement("beta1"), m), b.binary("subtract", g, m)));
      Value v = b.binary("add", b.binary("multiply", full(b, beta2, g), b.convert(v0, opmath)),
                         b.binary("multiply", full(b, complement("beta2"), g), b.binary("multiply", g, g)));
      // Bias corrections in float64 from the (already incremented) step.
      Value step = b.reshape(b.convert(element(ctx, "state_steps", x.i), DType::F64), {});
      Value bc1 = b.binary("subtract", one64, b.binary("power", hp("beta1", DType::F64), step));
      Value bc2 = b.binary("subtract", one64, b.binary("power", hp("beta2", DType::F64), step));
      Value step_size = b.convert(b.binary("divide", hp("lr", DType::F64), bc1), opmath);
      Value bc2_sqrt = b.convert(b.unary("sqrt", bc2), opmath);
      Value second = v;
      if (amsgrad) {
        const Value& vmax0 = element(ctx, "max_exp_avg_sqs", x.i);
        second = b.binary("maximum", b.convert(vmax0, opmath), v);
        update(ctx, x.s, "max_exp_avg_sqs", x.i, vmax0, second);
      }
      Value denom = b.binary("add", b.binary("divide", b.unary("sqrt", second), full(b, bc2_sqrt, v)),
                             full(b, eps, v));
      update(ctx, x.s, "exp_avgs", x.i, m0, m);
      update(ctx, x.s, "exp_avg_sqs", x.i, v0, v);
      return b.binary("subtract", p, b.binary("multiply", full(b, step_size, p), b.binary("divide", m, denom)));
    });
    return {};
  };
}

std::vector<Value> sgd(LoweringContext& ctx) {
  Builder& b = ctx.b;
  bool weight_decay = maybe_nonzero(ctx, "weight_decay");
  const Arg& bufs = ctx.arg("momentum_buffer_list");
  bool momentum = bufs.kind == Arg::TensorList && !bufs.tensors.empty();
  bool nesterov = ctx.to_bool("nesterov", false), first = ctx.to_bool("is_first_step", false);
  Hypers hp(ctx);
  for_each_param(ctx, [&](const Param& x) {
    Value g = x.g;
    if (weight_decay) g = b.binary("add", g, b.binary("multiply", full(b, hp("weight_decay", x.opmath), x.p), x.p));
    if (momentum) {
      const Value& buf0 = bufs.tensors.at(x.i);
      Value mu = full(b, hp("momentum", x.opmath), g);
      Value buf = g;
      if (!first) {
        Value damp = b.convert(b.binary("subtract", b.constant(1.0, DType::F64), hp("dampening", DType::F64)),
                               x.opmath);  // (in float64, then rounded, as CPU's kernel)
        buf = b.binary("add", b.binary("multiply", mu, b.convert(buf0, x.opmath)),
                       b.binary("multiply", full(b, damp, g), g));
      }
      update(ctx, x.s, "momentum_buffer_list", x.i, buf0, buf);
      g = nesterov ? b.binary("add", g, b.binary("multiply", mu, buf)) : buf;
    }
    return b.binary("subtract", x.p, b.binary("multiply", full(b, hp("lr", x.opmath), x.p), g));
  });
  return {};
}

// Adagrad: clr = lr / (1 + (step - 1) * lr_decay) in float64 from the (already
// incremented) step; state_sum += g^2; param -= clr * g / (sqrt(state_sum) + eps).
std::vector<Value> adagrad(LoweringContext& ctx) {
  Builder& b = ctx.b;
  bool weight_decay = maybe_nonzero(ctx, "weight_decay");
  Hypers hp(ctx);
  for_each_param(ctx, [&](const Param& x) {
    Value g = x.g;
    if (weight_decay) g = b.binary("add", g, b.binary("multiply", x.p, full(b, hp("weight_decay", x.opmath), x.p)));
    Value step = b.reshape(b.convert(element(ctx, "state_steps", x.i), DType::F64), {});
    Value one64 = b.constant(1.0, DType::F64);
    Value decay = b.binary("add", one64, b.binary("multiply", b.binary("subtract", step, one64),
                                                  hp("lr_decay", DType::F64)));
    Value clr = b.convert(b.binary("divide", hp("lr", DType::F64), decay), x.opmath);
    const Value& sum0 = element(ctx, "state_sums", x.i);
    Value sum = b.binary("add", b.convert(sum0, x.opmath), b.binary("multiply", g, g));
    Value std = b.binary("add", b.unary("sqrt", sum), full(b, hp("eps", x.opmath), sum));
    update(ctx, x.s, "state_sums", x.i, sum0, sum);
    return b.binary("subtract", x.p, b.binary("multiply", full(b, clr, x.p), b.binary("divide", g, std)));
  });
  return {};
}

}  // namespace

TORCH_PJRT_LOWERING("_fused_adam", adam(false));
TORCH_PJRT_LOWERING("_fused_adamw", adam(true));
TORCH_PJRT_LOWERING("_fused_sgd", sgd);
TORCH_PJRT_LOWERING("_fused_adagrad", adagrad);

}  // namespace torch_pjrt::lowering::ops
