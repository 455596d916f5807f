// Binary arithmetic with PyTorch's type promotion and broadcasting, copy and fill.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// The dtype mul/div/floor_divide compute in. CPU's kernels take a one-element
// `other` (Python scalar, 0-d or one-element tensor) of a float16/bfloat16
// result at its original value in float32 (opmath) and round once: 0 * 2**31
// is 0, where rounding 2**31 to float16 first gives 0 * inf = nan.
// (add/sub/remainder round the scalar to the dtype first, as computed here.)
DType scalar_math_dtype(const LoweringContext& ctx, DType dt) {
  const Arg& o = ctx.arg("other");
  bool one_element = o.kind != Arg::Tensor || numel(o.tensor.shape()) == 1;
  // (float8 in float32, rounded once with PyTorch's saturating conversion:
  // XLA's float8 arithmetic makes NaN of an overflow. Compiled graphs reach
  // here; eager float8 arithmetic runs CPU's kernels.)
  return one_element || is_float8(dt) ? math_dtype(dt) : dt;
}

// add/sub: self + alpha * other, computed in the promoted dtype.
std::vector<Value> add_sub(LoweringContext& ctx, const char* hlo) {
  Builder& b = ctx.b;
  if (std::string(hlo) == "subtract") {  // CPU's sub_check (a _foreach_sub over a large list is not probed on CPU)
    auto is_bool = [&](const char* n) {
      const Arg& a = ctx.arg(n);
      return a.kind == Arg::Bool || (a.kind == Arg::Tensor && a.tensor.dtype() == DType::Bool);
    };
    bool sb = is_bool("self"), ob = is_bool("other");
    if (sb && ob)
      ctx.fail("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
               "`logical_xor()` operator instead.");
    if (sb || ob)
      ctx.fail("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
               "invert a mask, use the `~` or `logical_not()` operator instead.");
  }
  DType out = compute_dtype(ctx, "self", "other");
  DType dt = is_float8(out) ? DType::F32 : out;  // (as scalar_math_dtype)
  const Shape& shape = ctx.out().shape;
  Value a = operand_as(ctx, "self", dt, shape);
  Value o = operand_as(ctx, "other", dt, shape);
  // A runtime alpha (optimizers' -lr) always multiplies; a constant 1 is skipped.
  // Read through ctx.scalar, which raises for an argument that is not a number
  // instead of taking it as 0.
  const Arg* alpha = ctx.find("alpha");
  // (A runtime alpha's value is not read: the program serves every value.)
  Scalar alpha_value = ctx.has("alpha") && !alpha->dynamic ? ctx.scalar("alpha") : Scalar::from_int(1);
  bool uint_subtracted = alpha_value.kind == Scalar::UInt && std::string(hlo) == "subtract";
  if (!uint_subtracted) check_scalar_fits(ctx, "alpha", dt);
  if (uint_subtracted) {
    // CPU subtracts as an add of -alpha, and negates a uint64 Scalar as the
    // int64 of its bits: sub(x, y, alpha=2**64 - 1) is x + y there.
    alpha_value = Scalar::from_int(static_cast<int64_t>(0 - static_cast<uint64_t>(alpha_value.i)));
    hlo = "add";
  }
  bool scaled = (alpha && alpha->dynamic) || alpha_value.to_double() != 1.0;
  if (scaled) {
    // alpha in the operands' dtype (CPU's kernel takes it as scalar_t); half
    // types then compute self + alpha * other in float32 (the product is
    // exact there) and round once, as CPU's vectorized fmadd does (SGD's
    // param.add_(grad, alpha=-lr) in bfloat16 rounded twice here).
    Value al = alpha && alpha->dynamic ? ctx.operand("alpha", dt) : b.splat(alpha_value, TensorType{dt, {}});
    DType m = math_dtype(dt);
    if (m != dt) {
      a = b.convert(a, m);
      o = b.convert(o, m);
      al = b.convert(al, m);
    }
    o = b.binary("multiply", o, b.broadcast_to(al, shape));
  }
  if (dt == DType::Bool)  // bool add is logical or (sub is rejected by PyTorch)
    return {b.binary("or", a, o)};
  return {b.convert(b.binary(hlo, a, o), out)};
}

std::vector<Value> mul(LoweringContext& ctx) {
  Builder& b = ctx.b;
  DType dt = compute_dtype(ctx, "self", "other"), mt = scalar_math_dtype(ctx, dt);
  const Shape& shape = ctx.out().shape;
  // (A bool factor keeps False * inf = nan: Builder::convert's barrier.)
  Value a = operand_as(ctx, "self", mt, shape), o = operand_as(ctx, "other", mt, shape);
  return {b.convert(b.binary(dt == DType::Bool ? "and" : "multiply", a, o), dt)};
}

// Integer division and remainder by zero raise on CPU ("ZeroDivisionError",
// a RuntimeError); XLA returns a number.
void check_divisor(LoweringContext& ctx, const Value& d) {
  if (is_float(d.dtype()) || is_complex(d.dtype()) || d.dtype() == DType::Bool) return;
  ctx.check_all(ctx.b.compare(Cmp::NE, d, splat_like(ctx.b, 0, d)), "ZeroDivisionError",
                LoweringContext::CheckError::Runtime);
}

// fn(self, other) for a division-like op. (A bool dividend keeps False / 0 =
// nan: XLA's rewrite of convert(p) / d into a select is stopped by
// Builder::convert's barrier.)
template <class Fn>
Value divide_operands(LoweringContext& ctx, DType mt, const Fn& fn) {
  const Shape& shape = ctx.out().shape;
  Value d = ctx.operand("other", mt);
  // XLA turns x / c for a constant c into x * (1 / c), 1 ulp off CPU's
  // quotient in a third of the elements (x / 3): a constant divisor (a
  // Python int) goes through a barrier, as runtime scalars and tensors do.
  const Arg& other = ctx.arg("other");
  if (is_float(mt) && (other.kind == Arg::Tensor ? other.wrapped_number : !other.dynamic))
    d = ctx.b.op("stablehlo.optimization_barrier", {d}, d.type);
  d = ctx.b.broadcast_to(d, shape);
  check_divisor(ctx, d);
  return fn(operand_as(ctx, "self", mt, shape), d);
}

std::vector<Value> div(LoweringContext& ctx) {
  Builder& b = ctx.b;
  std::string mode = ctx.str("rounding_mode");
  DType dt = compute_dtype(ctx, "self", "other");
  if (mode.empty() && !is_float(dt) && !is_complex(dt)) dt = ctx.default_float;  // true division of integers
  DType mt = scalar_math_dtype(ctx, dt);
  Value q = divide_operands(ctx, mt, [&](const Value& a, const Value& d) {
    if (mode == "floor") return floor_divide(b, a, d);
    Value q = b.binary("divide", a, d);  // integer divide truncates
    if (mode == "trunc" && is_float(mt))
      q = b.select(b.compare(Cmp::LT, q, splat_like(b, 0, q)), b.unary("ceil", q), b.unary("floor", q));
    return q;
  });
  return {b.convert(q, dt)};
}

// Division-like ops computed in the promoted dtype on operands broadcast to
// the output; `scalar_opmath`: as CPU's floor_divide, in float32 for a
// one-element divisor of a half result (see scalar_math_dtype).
template <Value (*Fn)(Builder&, const Value&, const Value&), bool scalar_opmath = false>
std::vector<Value> promoted_division(LoweringContext& ctx) {
  DType dt = compute_dtype(ctx, "self", "other");
  DType mt = scalar_opmath ? scalar_math_dtype(ctx, dt) : dt;
  Value r = divide_operands(ctx, mt, [&](const Value& a, const Value& d) { return Fn(ctx.b, a, d); });
  return {ctx.b.convert(r, dt)};
}

Value c_remainder(Builder& b, const Value& a, const Value& d) { return b.binary("remainder", a, d); }

// copy_(self, src): src converted to self's dtype and broadcast to its shape.
std::vector<Value> copy(LoweringContext& ctx) {
  return {ctx.b.convert(ctx.tensor("src"), ctx.out().dtype)};
}

// fill_(self, value): value may be a Scalar or a 0-d tensor.
std::vector<Value> fill(LoweringContext& ctx) {
  check_scalar_fits(ctx, "value", ctx.out().dtype);
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
TORCH_PJRT_LOWERING("floor_divide", promoted_division<floor_divide, true>);
// xlogy(x, y) = x * log(y), 0 where x == 0, NaN where y is NaN (kl_div uses it);
// half types computed in float32 as on CPU.
TORCH_PJRT_LOWERING("xlogy", [](LoweringContext& ctx) -> std::vector<Value> {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  Value x = operand_rounded(ctx, "self", out.dtype, out.shape), y = operand_rounded(ctx, "other", out.dtype, out.shape);
  // (log rounded to a half type first: CPU's std::log of a c10 half returns one.)
  Value r = b.binary("multiply", x, rounded_to(b, b.unary("log", y), out.dtype));
  r = b.select(b.compare(Cmp::EQ, x, splat_like(b, 0, x)), splat_like(b, 0, x), r);
  r = b.select(b.compare(Cmp::NE, y, y), y, r);
  return {b.convert(r, out.dtype)};
});
TORCH_PJRT_LOWERING("copy", copy);
TORCH_PJRT_LOWERING("fill", fill);
TORCH_PJRT_LOWERING("zero", zero);

}  // namespace torch_pjrt::lowering::ops
