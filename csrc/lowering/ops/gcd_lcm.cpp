// gcd and lcm of integers, elementwise: Euclid's algorithm on absolute values,
// as CPU's calc_gcd, in a loop that runs until every pair is done (at most
// about 1.44 log2 of the largest value steps).
#include <string>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> gcd_lcm(LoweringContext& ctx, bool lcm) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  if (!is_integral(out.dtype, false))
    ctx.kernel_not_implemented(lcm ? "lcm_cpu" : "gcd_cpu", out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  Value a = operand_as(ctx, "self", out.dtype, out.shape), c = operand_as(ctx, "other", out.dtype, out.shape);
  if (!is_unsigned(out.dtype)) {
    a = b.unary("abs", a);
    c = b.unary("abs", c);
  }
  std::vector<int64_t> all;
  for (int64_t d = 0; d < int64_t(out.shape.size()); ++d) all.push_back(d);
  Value zero = b.zeros(out), one = b.splat(Scalar::from_int(1), out);
  auto cond = [&](Builder& b, const std::vector<Value>& s) {
    Value going = b.compare(Cmp::NE, s[0], zero);
    return std::vector<Value>{b.reduce(going, b.constant(Scalar::from_bool(false), DType::Bool), all, "stablehlo.or")};
  };
  // (x, y) -> (y % x, x) while x != 0; y is the gcd when x reaches 0.
  auto body = [&](Builder& b, const std::vector<Value>& s) {
    Value going = b.compare(Cmp::NE, s[0], zero);
    Value rem = b.binary("remainder", s[1], b.select(going, s[0], one));
    return std::vector<Value>{b.select(going, rem, s[0]), b.select(going, s[0], s[1])};
  };
  Value g = b.while_loop({a, c}, cond, body)[1];
  if (!lcm) return {g};
  // lcm = |a / g * b|, 0 where g is 0; narrow types in int as C++ promotes
  // them, then wrapped back.
  DType wide = out.dtype == DType::I64 || out.dtype == DType::I32 ? out.dtype : DType::I32;
  Value x = b.convert(operand_as(ctx, "self", out.dtype, out.shape), wide);
  Value y = b.convert(operand_as(ctx, "other", out.dtype, out.shape), wide);
  Value gw = b.convert(g, wide);
  Value nonzero = b.compare(Cmp::NE, g, zero);
  Value r = b.binary("multiply", b.binary("divide", x, b.select(nonzero, gw, b.convert(one, wide))), y);
  r = b.convert(b.unary("abs", r), out.dtype);
  return {b.select(nonzero, r, zero)};
}

}  // namespace

TORCH_PJRT_LOWERING("gcd", [](LoweringContext& c) { return gcd_lcm(c, false); });
TORCH_PJRT_LOWERING("lcm", [](LoweringContext& c) { return gcd_lcm(c, true); });

}  // namespace torch_pjrt::lowering::ops
