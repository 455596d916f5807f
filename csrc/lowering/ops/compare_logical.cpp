// Comparisons, logical and bitwise ops, where/masked_fill, and the min/max
// family (maximum, minimum, clamp). Comparisons happen in the promoted dtype of
// both operands, as in PyTorch.
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

std::vector<Value> compare(LoweringContext& ctx, Cmp dir) {
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  return {ctx.b.compare(dir, operand_as(ctx, "self", dt, shape), operand_as(ctx, "other", dt, shape))};
}

// logical_*: every operand as bool (nonzero is true).
std::vector<Value> logical(LoweringContext& ctx, const char* hlo) {
  const Shape& shape = ctx.out().shape;
  Value a = operand_as(ctx, "self", DType::Bool, shape), o = operand_as(ctx, "other", DType::Bool, shape);
  return {ctx.b.binary(hlo, a, o)};
}

std::vector<Value> bitwise(LoweringContext& ctx, const char* hlo) {
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  return {ctx.b.binary(hlo, operand_as(ctx, "self", dt, shape), operand_as(ctx, "other", dt, shape))};
}

// bitwise_left_shift / bitwise_right_shift and the << >> operators, in the
// promoted integer dtype. CPU gives 0 for a left shift by a negative amount
// or by the width or more, and the sign fill (signed) or 0 (unsigned) for
// such a right shift; StableHLO's shifts read the amount as unsigned and do
// the same.
std::vector<Value> shift(LoweringContext& ctx, bool left) {
  DType dt = compute_dtype(ctx, "self", "other");
  if (!is_integral(dt, /*include_bool=*/false)) ctx.kernel_not_implemented(left ? "lshift_cpu" : "rshift_cpu", dt);
  const Shape& shape = ctx.out().shape;
  const char* hlo = left ? "shift_left" : is_unsigned(dt) ? "shift_right_logical" : "shift_right_arithmetic";
  return {ctx.b.binary(hlo, operand_as(ctx, "self", dt, shape), operand_as(ctx, "other", dt, shape))};
}

// NaN-propagating maximum/minimum (PyTorch's), for any dtype. On ties (-0.0
// against 0.0) CPU's vectorized maximum/minimum give `o`, clamp keeps `a`
// (clamp(-0.0, min=0.0) is -0.0): `keep_a_on_tie`.
Value pick(Builder& b, Cmp dir, const Value& a, const Value& o, bool keep_a_on_tie = false) {
  if (a.dtype() == DType::Bool) return b.binary(dir == Cmp::GT ? "or" : "and", a, o);
  bool nan = is_float(a.dtype());
  if (keep_a_on_tie) {
    Value take_o = b.compare(dir, o, a);
    if (nan) take_o = b.binary("or", take_o, b.compare(Cmp::NE, o, o));
    return b.select(take_o, o, a);
  }
  Value take_a = b.compare(dir, a, o);
  if (nan) take_a = b.binary("or", take_a, b.compare(Cmp::NE, a, a));
  return b.select(take_a, a, o);
}

std::vector<Value> max_min(LoweringContext& ctx, Cmp dir) {
  DType dt = compute_dtype(ctx, "self", "other");
  const Shape& shape = ctx.out().shape;
  return {pick(ctx.b, dir, operand_as(ctx, "self", dt, shape), operand_as(ctx, "other", dt, shape))};
}

// clamp(self, min, max) = min(max(self, min), max); either bound may be absent
// and each is a Scalar or a Tensor. The output dtype is already promoted.
std::vector<Value> clamp(LoweringContext& ctx, const char* lo, const char* hi) {
  const Shape& shape = ctx.out().shape;
  // In the operands' promoted type, then the result's: an in-place or out=
  // clamp of a narrower type by a wider tensor bound compares in the wider
  // type, as CPU's TensorIterator does (uint8.clamp_(min=int64 -1) keeps
  // self; the bound is not wrapped to 255 first).
  std::vector<PromotionOperand> ops{ctx.promotion("self")};
  for (const char* b : {lo, hi})
    if (b && ctx.has(b)) ops.push_back(ctx.promotion(b));
  DType dt = result_type(ops, ctx.default_float);
  for (const char* b : {lo, hi})
    if (b) check_scalar_fits(ctx, b, ctx.out().dtype, /*floats=*/true);
  Value r = operand_as(ctx, "self", dt, shape);
  if (lo && ctx.has(lo)) r = pick(ctx.b, Cmp::GT, r, operand_as(ctx, lo, dt, shape), true);
  if (hi && ctx.has(hi)) r = pick(ctx.b, Cmp::LT, r, operand_as(ctx, hi, dt, shape), true);
  return {ctx.b.convert(r, ctx.out().dtype)};
}

std::vector<Value> where(LoweringContext& ctx) {
  DType dt = ctx.out().dtype;
  for (const char* name : {"self", "other"}) check_scalar_fits(ctx, name, dt);
  const Shape& shape = ctx.out().shape;
  Value cond = operand_as(ctx, "condition", DType::Bool, shape);
  return {ctx.b.select(cond, operand_as(ctx, "self", dt, shape), operand_as(ctx, "other", dt, shape))};
}

// masked_fill(self, mask, value): value is a Scalar or a 0-d tensor.
std::vector<Value> masked_fill(LoweringContext& ctx) {
  DType dt = ctx.out().dtype;
  check_scalar_fits(ctx, "value", dt);
  const Shape& shape = ctx.out().shape;
  Value mask = operand_as(ctx, "mask", DType::Bool, shape);
  return {ctx.b.select(mask, operand_as(ctx, "value", dt, shape), operand_as(ctx, "self", dt, shape))};
}

// isin(elements, test_elements, assume_unique, invert) and its Scalar forms:
// every element compared with every test element ([n, m] equalities, any
// over m), in torch.result_type of the two; generate()'s end-of-sequence
// check is this with a handful of test elements.
std::vector<Value> isin(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  const char* elem = ctx.has("elements") ? "elements" : "element";
  const char* test = ctx.has("test_elements") ? "test_elements" : "test_element";
  DType dt = compute_dtype(ctx, elem, test);
  auto flat = [&](const char* name) {
    const Arg* a = ctx.find(name);
    Value v = a && a->kind == Arg::Tensor ? b.convert(ctx.tensor(name), dt) : b.constant(ctx.scalar(name), dt);
    return b.reshape(v, Shape{v.type.numel()});
  };
  bool invert = ctx.to_bool("invert", false);
  Value e = flat(elem), t = flat(test);
  int64_t n = e.type.numel(), m = t.type.numel();
  if (n == 0 || m == 0) return {b.splat(Scalar::from_bool(invert), out)};
  Shape nm{n, m};
  Value eq = b.compare(Cmp::EQ, b.broadcast_in_dim(e, nm, {0}), b.broadcast_in_dim(t, nm, {1}));
  Value any = b.reduce(eq, b.constant(Scalar::from_bool(false), DType::Bool), {1}, "stablehlo.or");
  if (invert) any = b.unary("not", any);
  return {b.reshape(any, out.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("isin", isin);
TORCH_PJRT_LOWERING("eq", [](LoweringContext& c) { return compare(c, Cmp::EQ); });
TORCH_PJRT_LOWERING("ne", [](LoweringContext& c) { return compare(c, Cmp::NE); });
TORCH_PJRT_LOWERING("lt", [](LoweringContext& c) { return compare(c, Cmp::LT); });
TORCH_PJRT_LOWERING("le", [](LoweringContext& c) { return compare(c, Cmp::LE); });
TORCH_PJRT_LOWERING("gt", [](LoweringContext& c) { return compare(c, Cmp::GT); });
TORCH_PJRT_LOWERING("ge", [](LoweringContext& c) { return compare(c, Cmp::GE); });
TORCH_PJRT_LOWERING("logical_and", [](LoweringContext& c) { return logical(c, "and"); });
TORCH_PJRT_LOWERING("logical_or", [](LoweringContext& c) { return logical(c, "or"); });
TORCH_PJRT_LOWERING("logical_xor", [](LoweringContext& c) { return logical(c, "xor"); });
TORCH_PJRT_LOWERING("logical_not", [](LoweringContext& c) {
  return std::vector<Value>{c.b.unary("not", c.b.convert(c.tensor("self"), DType::Bool))};
});
TORCH_PJRT_LOWERING("bitwise_and", [](LoweringContext& c) { return bitwise(c, "and"); });
TORCH_PJRT_LOWERING("bitwise_or", [](LoweringContext& c) { return bitwise(c, "or"); });
TORCH_PJRT_LOWERING("bitwise_xor", [](LoweringContext& c) { return bitwise(c, "xor"); });
TORCH_PJRT_LOWERING("bitwise_left_shift", [](LoweringContext& c) { return shift(c, true); });
TORCH_PJRT_LOWERING("__lshift__", [](LoweringContext& c) { return shift(c, true); });
TORCH_PJRT_LOWERING("__ilshift__", [](LoweringContext& c) { return shift(c, true); });
TORCH_PJRT_LOWERING("bitwise_right_shift", [](LoweringContext& c) { return shift(c, false); });
TORCH_PJRT_LOWERING("__rshift__", [](LoweringContext& c) { return shift(c, false); });
TORCH_PJRT_LOWERING("__irshift__", [](LoweringContext& c) { return shift(c, false); });
TORCH_PJRT_LOWERING("bitwise_not", [](LoweringContext& c) {
  return std::vector<Value>{c.b.unary("not", c.tensor("self"))};
});
TORCH_PJRT_LOWERING("maximum", [](LoweringContext& c) { return max_min(c, Cmp::GT); });
TORCH_PJRT_LOWERING("minimum", [](LoweringContext& c) { return max_min(c, Cmp::LT); });
TORCH_PJRT_LOWERING("clamp", [](LoweringContext& c) { return clamp(c, "min", "max"); });
TORCH_PJRT_LOWERING("clamp_min", [](LoweringContext& c) { return clamp(c, "min", nullptr); });
TORCH_PJRT_LOWERING("clamp_max", [](LoweringContext& c) { return clamp(c, nullptr, "max"); });
TORCH_PJRT_LOWERING("where", where);
TORCH_PJRT_LOWERING("masked_fill", masked_fill);

}  // namespace torch_pjrt::lowering::ops
