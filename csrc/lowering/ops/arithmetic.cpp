// Binary arithmetic with PyTorch's type promotion and broadcasting, copy and fill.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// add/sub: self + alpha * other, computed in the promoted dtype.
std::vector<Value> add_sub(LoweringContext& ctx, const char* hlo) {
  Builder& b = ctx.b;
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  Value a = operand_as(ctx, "self", dt, shape);
  Value o = operand_as(ctx, "other", dt, shape);
  // A runtime alpha (optimizers' -lr) always multiplies; a constant 1 is skipped.
  const Arg* alpha = ctx.find("alpha");
  if (alpha && alpha->dynamic)
    o = b.binary("multiply", o, b.broadcast_to(ctx.operand("alpha", o.dtype()), shape));
  else if (alpha && alpha->kind != Arg::None && alpha->scalar.to_double() != 1.0)
    o = b.binary("multiply", o, b.splat(alpha->scalar, o.type));
  if (dt == DType::Bool)  // bool add is logical or (sub is rejected by PyTorch)
    return {b.binary("or", a, o)};
  return {b.binary(hlo, a, o)};
}

std::vector<Value> mul(LoweringContext& ctx) {
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  if (dt != DType::Bool && (is_float(dt) || is_complex(dt))) {
    // A bool factor as select(p, x, x * 0): XLA rewrites convert(p) * x into
    // select(p, x, 0), which loses False * inf = nan (and -0.0).
    for (const auto& [flag, other] : {std::pair{"self", "other"}, std::pair{"other", "self"}}) {
      if (ctx.promotion(flag).dtype != DType::Bool || ctx.promotion(other).dtype == DType::Bool) continue;
      Value p = ctx.b.broadcast_to(ctx.operand(flag, DType::Bool), shape);
      Value x = operand_as(ctx, other, dt, shape);
      return {ctx.b.select(p, x, ctx.b.binary("multiply", x, splat_like(ctx.b, 0, x)))};
    }
  }
  Value a = operand_as(ctx, "self", dt, shape), o = operand_as(ctx, "other", dt, shape);
  return {ctx.b.binary(dt == DType::Bool ? "and" : "multiply", a, o)};
}

// Integer division and remainder by zero raise on CPU ("ZeroDivisionError",
// a RuntimeError); XLA returns a number.
void check_divisor(LoweringContext& ctx, const Value& d) {
  if (is_float(d.dtype()) || is_complex(d.dtype()) || d.dtype() == DType::Bool) return;
  ctx.check_all(ctx.b.compare(Cmp::NE, d, splat_like(ctx.b, 0, d)), "ZeroDivisionError",
                LoweringContext::CheckError::Runtime);
}

std::vector<Value> div(LoweringContext& ctx) {
  Builder& b = ctx.b;
  std::string mode = ctx.str("rounding_mode");
  DType dt = compute_dtype(ctx, "self", "other");
  if (mode.empty() && !is_float(dt) && !is_complex(dt)) dt = DType::F32;  // true division of integers
  const Shape& shape = ctx.out().shape;
  Value a = operand_as(ctx, "self", dt, shape), d = operand_as(ctx, "other", dt, shape);
  check_divisor(ctx, d);
  if (mode == "floor") return {floor_divide(b, a, d)};
  Value q = b.binary("divide", a, d);  // integer divide truncates
  if (mode == "trunc" && is_float(dt))
    q = b.select(b.compare(Cmp::LT, q, splat_like(b, 0, q)), b.unary("ceil", q), b.unary("floor", q));
  return {q};
}

// Division-like ops computed in the promoted dtype on operands broadcast to the output.
template <Value (*Fn)(Builder&, const Value&, const Value&)>
std::vector<Value> promoted_division(LoweringContext& ctx) {
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  Value a = operand_as(ctx, "self", dt, shape), d = operand_as(ctx, "other", dt, shape);
  check_divisor(ctx, d);
  return {Fn(ctx.b, a, d)};
}

Value c_remainder(Builder& b, const Value& a, const Value& d) { return b.binary("remainder", a, d); }

// copy_(self, src): src converted to self's dtype and broadcast to its shape.
std::vector<Value> copy(LoweringContext& ctx) {
  return {ctx.b.convert(ctx.tensor("src"), ctx.out().dtype)};
}

// fill_(self, value): value may be a Scalar or a 0-d tensor.
std::vector<Value> fill(LoweringContext& ctx) {
  return {ctx.b.broadcast_to(ctx.operand("value", ctx.out().dtype), ctx.out().shape)};
}

std::vector<Value> zero(LoweringContext& ctx) {
  return {ctx.b.zeros(ctx.out())};
}

}  // namespace

TORCH_PJRT_LOWERING("add", [](LoweringContext& c) { return add_sub(c, "add"); });
TORCH_PJRT_LOWERING("sub", [](LoweringContext& c) { return add_sub(c, "subtract"); });
TORCH_PJRT_LOWERING("rsub", [](LoweringContext& c) {
  // rsub(self, other, alpha) = other - alpha * self
  std::swap(c.args[0].name, c.args[1].name);
  return add_sub(c, "subtract");
});
TORCH_PJRT_LOWERING("mul", mul);
TORCH_PJRT_LOWERING("div", div);
TORCH_PJRT_LOWERING("remainder", promoted_division<python_remainder>);
TORCH_PJRT_LOWERING("fmod", promoted_division<c_remainder>);
TORCH_PJRT_LOWERING("floor_divide", promoted_division<floor_divide>);
// xlogy(x, y) = x * log(y), 0 where x == 0, NaN where y is NaN (kl_div uses it);
// half types computed in float32 as on CPU.
TORCH_PJRT_LOWERING("xlogy", [](LoweringContext& ctx) -> std::vector<Value> {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  DType dt = math_dtype(out.dtype);
  Value x = operand_as(ctx, "self", dt, out.shape), y = operand_as(ctx, "other", dt, out.shape);
  Value r = b.binary("multiply", x, b.unary("log", y));
  r = b.select(b.compare(Cmp::EQ, x, splat_like(b, 0, x)), splat_like(b, 0, x), r);
  r = b.select(b.compare(Cmp::NE, y, y), y, r);
  return {b.convert(r, out.dtype)};
});
TORCH_PJRT_LOWERING("copy", copy);
TORCH_PJRT_LOWERING("fill", fill);
TORCH_PJRT_LOWERING("zero", zero);

}  // namespace torch_pjrt::lowering::ops
