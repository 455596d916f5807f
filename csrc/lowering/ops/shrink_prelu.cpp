// hardshrink, softshrink and PReLU with their backward ops, by the formulas of
// PyTorch's CPU kernels (NaN passes through; softshrink's zero is x * 0, so
// signed). Half types in float32, rounded once; float dtypes only, as on CPU.
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

struct In {
  LoweringContext& ctx;
  DType out, dt;
  Value operator()(const char* name) const { return operand_as(ctx, name, dt, ctx.out().shape); }
};

In inputs(LoweringContext& ctx, const char* kernel) {
  DType out = ctx.out().dtype;
  if (!is_float(out)) ctx.kernel_not_implemented(kernel, out);
  return {ctx, out, math_dtype(out)};
}

// -lambd <= x <= lambd (false for NaN).
Value inside(Builder& b, const Value& x, const Value& lambd) {
  return b.binary("and", b.compare(Cmp::GE, x, b.unary("negate", lambd)), b.compare(Cmp::LE, x, lambd));
}

std::vector<Value> hardshrink(LoweringContext& ctx) {
  Builder& b = ctx.b;
  In in = inputs(ctx, "hardshrink_cpu");
  Value x = in("self");
  return {b.convert(b.select(inside(b, x, in("lambd")), b.zeros(x.type), x), in.out)};
}

std::vector<Value> softshrink(LoweringContext& ctx) {
  Builder& b = ctx.b;
  In in = inputs(ctx, "softshrink_check");
  Value x = in("self"), l = in("lambd");
  Value r = b.select(b.compare(Cmp::LT, x, b.unary("negate", l)), b.binary("add", x, l),
                     b.binary("multiply", x, b.zeros(x.type)));
  r = b.select(b.compare(Cmp::GT, x, l), b.binary("subtract", x, l), r);
  return {b.convert(r, in.out)};
}

// Both backward ops: grad outside [-lambd, lambd], else 0.
std::vector<Value> shrink_backward(LoweringContext& ctx, const char* grad) {
  Builder& b = ctx.b;
  In in = inputs(ctx, "shrink_backward_cpu");
  Value g = in(grad);
  return {b.convert(b.select(inside(b, in("self"), in("lambd")), b.zeros(g.type), g), in.out)};
}

// _prelu_kernel(self, weight): weight comes already shaped to broadcast.
std::vector<Value> prelu(LoweringContext& ctx) {
  Builder& b = ctx.b;
  In in = inputs(ctx, "prelu_cpu");
  Value x = in("self");
  Value r = b.select(b.compare(Cmp::GT, x, b.zeros(x.type)), x, b.binary("multiply", in("weight"), x));
  return {b.convert(r, in.out)};
}

// (grad_self, grad_weight), both of self's shape (autograd sums the second
// to the weight's).
std::vector<Value> prelu_backward(LoweringContext& ctx) {
  Builder& b = ctx.b;
  In in = inputs(ctx, "prelu_backward_cpu");
  Value g = in("grad_output"), x = in("self"), w = in("weight");
  Value pos = b.compare(Cmp::GT, x, b.zeros(x.type));
  Value gx = b.select(pos, g, b.binary("multiply", w, g));
  Value gw = b.select(pos, b.zeros(x.type), b.binary("multiply", x, g));
  return {b.convert(gx, ctx.out(0).dtype), b.convert(gw, ctx.out(1).dtype)};
}

}  // namespace

TORCH_PJRT_LOWERING("hardshrink", hardshrink);
TORCH_PJRT_LOWERING("softshrink", softshrink);
TORCH_PJRT_LOWERING("hardshrink_backward", [](LoweringContext& c) { return shrink_backward(c, "grad_out"); });
TORCH_PJRT_LOWERING("softshrink_backward", [](LoweringContext& c) { return shrink_backward(c, "grad_output"); });
TORCH_PJRT_LOWERING("_prelu_kernel", prelu);
TORCH_PJRT_LOWERING("_prelu_kernel_backward", prelu_backward);

}  // namespace torch_pjrt::lowering::ops
