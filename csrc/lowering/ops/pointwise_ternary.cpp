// Pointwise ops of three operands: addcmul, addcdiv, lerp. Half types are
// computed in float32 and rounded once, as PyTorch's CPU kernels do; the
// operation order follows those kernels so float32 results match closely.
// (where, clamp with tensor bounds and masked_fill live in compare_logical.cpp.)
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// addcmul: self + value * tensor1 * tensor2; addcdiv: self + value * tensor1 / tensor2.
std::vector<Value> addc(LoweringContext& ctx, const char* hlo) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  DType dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  // CPU's kernel errors (its probe does not run on large _foreach_ lists).
  bool div = std::string(hlo) == "divide";
  if (dt == DType::Bool)
    ctx.kernel_not_implemented(div ? "addcdiv_cpu_out" : "addcmul_cpu_out", dt);
  if (div && is_integral(ctx.tensor("tensor1").dtype(), true) && is_integral(ctx.tensor("tensor2").dtype(), true))
    ctx.fail("Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a "
             "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + "
             "value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * "
             "tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter implementation: "
             "(input + value * tensor1 / tensor2), for all dtypes.");
  Value self = operand_as(ctx, "self", dt, shape);
  Value t1 = operand_as(ctx, "tensor1", dt, shape), t2 = operand_as(ctx, "tensor2", dt, shape);
  Value v = operand_as(ctx, "value", dt, shape);
  // (A bool factor keeps nan * False = nan: Builder::convert's barrier.)
  Value m = b.binary("multiply", v, t1);
  Value r = b.binary("add", self, b.binary(hlo, m, t2));
  return {b.convert(r, out)};
}

// lerp(self, end, weight) with PyTorch's two-sided formula, exact at weight 0 and 1:
// |w| < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w).
std::vector<Value> lerp(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType out = ctx.out().dtype;
  if (!is_float(out) && !is_complex(out))
    ctx.kernel_not_implemented(ctx.arg("weight").kind == Arg::Tensor ? "lerp_kernel_tensor" : "lerp_kernel_scalar", out);
  DType dt = math_dtype(out);
  const Shape& shape = ctx.out().shape;
  Value self = operand_as(ctx, "self", dt, shape), end = operand_as(ctx, "end", dt, shape);
  Value w = operand_as(ctx, "weight", dt, shape);
  Value diff = b.binary("subtract", end, self);
  Value abs_w = is_complex(dt) ? complex_abs(b, w) : b.unary("abs", w);  // (CPU: |w| < 0.5 of a complex w too)
  Value small = b.compare(Cmp::LT, abs_w, splat_like(b, 0.5, abs_w));
  Value lo = b.binary("add", self, b.binary("multiply", w, diff));
  Value hi = b.binary("subtract", end, b.binary("multiply", diff, b.binary("subtract", splat_like(b, 1, w), w)));
  return {b.convert(b.select(small, lo, hi), out)};
}

}  // namespace

TORCH_PJRT_LOWERING("addcmul", [](LoweringContext& c) { return addc(c, "multiply"); });
TORCH_PJRT_LOWERING("addcdiv", [](LoweringContext& c) { return addc(c, "divide"); });
TORCH_PJRT_LOWERING("lerp", lerp);

}  // namespace torch_pjrt::lowering::ops
