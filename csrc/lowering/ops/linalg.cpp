// Cholesky factorization and triangular solves, through StableHLO's cholesky
// and triangular_solve (XLA expands them on every backend): linalg_cholesky_ex,
// cholesky, linalg_solve_triangular, triangular_solve, _cholesky_solve_helper
// (cholesky_solve) and cholesky_inverse. Real dtypes (complex ones take the
// CPU fallback); half types in float32. Where the input is not positive-
// definite, `info` is non-zero as on CPU, but it may name an earlier order
// than LAPACK's: XLA's blocked factorization gives NaN for a whole block where
// LAPACK stops at the first failing leading minor (L's entries differ there too).
#include <string>

#include "lowering/ops/linalg.h"

namespace torch_pjrt::lowering::ops {

Value triangle(Builder& b, const Value& x, bool lower) {
  int64_t r = x.rank();
  TensorType it{DType::I64, x.shape()};
  Value row = b.iota(it, r - 2), col = b.iota(it, r - 1);
  return b.select(b.compare(lower ? Cmp::GE : Cmp::LE, row, col), x, b.zeros(x.type));
}

Value triangular_solve(Builder& b, const Value& a, const Value& rhs, bool left, bool lower, bool unit,
                       bool transpose) {
  return b.op("stablehlo.triangular_solve", {a, rhs}, rhs.type,
              std::string("left_side = ") + (left ? "true" : "false") + ", lower = " + (lower ? "true" : "false") +
                  ", unit_diagonal = " + (unit ? "true" : "false") + ", transpose_a = #stablehlo<transpose " +
                  (transpose ? "TRANSPOSE" : "NO_TRANSPOSE") + ">");
}

Value with_batch(Builder& b, const Value& x, const Shape& batch) {
  Shape s = batch;
  s.insert(s.end(), x.shape().end() - 2, x.shape().end());
  return b.broadcast_to(x, s);
}

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

Value flatten_batch(Builder& b, const Value& x, int keep) {
  Shape s(x.shape().end() - keep, x.shape().end());
  int64_t bt = 1;
  for (auto it = x.shape().begin(); it != x.shape().end() - keep; ++it) bt *= *it;
  s.insert(s.begin(), bt);
  return b.reshape(x, s);
}

Value identity_like(Builder& b, const TensorType& t) {
  TensorType it{DType::I64, t.shape};
  return b.convert(b.compare(Cmp::EQ, b.iota(it, t.rank() - 2), b.iota(it, t.rank() - 1)), t.dtype);
}

void real_only(LoweringContext& ctx, DType t) {
  if (!is_float(t)) ctx.fail(std::string("linalg: expected a floating point tensor, got ") + dtype_name(t));
}

namespace {

Value cholesky(Builder& b, const Value& x, bool lower) {
  Value l = b.op("stablehlo.cholesky", {x}, x.type, std::string("lower = ") + (lower ? "true" : "false"));
  return triangle(b, l, lower);
}

// info per matrix: 0, or i + 1 for the first diagonal entry of the factor
// that is not positive (NaN included).
Value cholesky_info(Builder& b, const Value& l) {
  int64_t r = l.rank(), n = l.shape().back();
  TensorType it{DType::I64, l.shape()};
  Value diag_mask = b.compare(Cmp::EQ, b.iota(it, r - 2), b.iota(it, r - 1));
  Value bad = b.binary("and", diag_mask, b.unary("not", b.compare(Cmp::GT, l, b.zeros(l.type))));
  Value order = b.binary("add", b.iota(it, r - 1), b.splat(Scalar::from_int(1), it));
  Value cand = b.select(bad, order, b.splat(Scalar::from_int(n + 1), it));
  Value first = b.reduce(cand, b.constant_int(n + 1, DType::I64), {r - 2, r - 1}, "stablehlo.minimum");
  Value none = b.compare(Cmp::EQ, first, b.splat(Scalar::from_int(n + 1), first.type));
  return b.convert(b.select(none, b.zeros(first.type), first), DType::I32);
}

// XLA's cholesky fills a matrix it cannot factor with NaN, so the factor
// says only that it failed. LAPACK's info is the order of the first pivot
// that is not positive: where any matrix failed, a column loop over the
// triangle potrf reads finds it (the loop runs only then, in a
// stablehlo.if). x [.., n, n], first [..] i32 (cholesky_info of XLA's factor).
Value cholesky_failed_order(Builder& b, const Value& x, bool lower, const Value& first) {
  Value a = flatten_batch(b, x, 2);
  const int64_t bt = a.shape()[0], n = a.shape()[2];
  if (!lower) a = b.transpose(a, {0, 2, 1});
  Value l = triangle(b, a, true);
  TensorType it{DType::I64, {bt, n, n}};
  Value strict = b.compare(Cmp::GT, b.iota(it, 1), b.iota(it, 2));
  Value sym = b.binary("add", l, b.transpose(b.select(strict, l, b.zeros(l.type)), {0, 2, 1}));
  Value f = b.reshape(first, {bt});
  Value any = b.reduce(b.compare(Cmp::NE, f, b.zeros(f.type)), b.constant(Scalar::from_bool(false), DType::Bool),
                       {0}, "stablehlo.or");
  auto search = [=](Builder& b, const std::vector<Value>&) {
    auto cond = [n](Builder& b, const std::vector<Value>& s) {
      return std::vector<Value>{b.compare(Cmp::LT, s[0], b.constant_int(n, DType::I64))};
    };
    auto body = [=](Builder& b, const std::vector<Value>& s) {
      const Value &j = s[0], &m = s[1], &info = s[2];
      Value zero = b.constant_int(0, DType::I64);
      Value d = b.reshape(b.dynamic_slice(m, {zero, j, j}, {bt, 1, 1}), {bt});
      Value bad = b.unary("not", b.compare(Cmp::GT, d, b.zeros(d.type)));
      Value order = b.convert(b.broadcast_in_dim(b.binary("add", j, b.constant_int(1, DType::I64)), {bt}, {}), DType::I32);
      Value next_info = b.select(b.binary("and", bad, b.compare(Cmp::EQ, info, b.zeros(info.type))), order, info);
      // The trailing update with this column (a failed matrix's later steps do not matter).
      Value root = b.select(bad, b.splat(Scalar::from_float(1.0), d.type), b.unary("sqrt", d));
      Value col = b.reshape(b.dynamic_slice(m, {zero, zero, j}, {bt, n, 1}), {bt, n});
      Value below = b.compare(Cmp::GT, b.iota(TensorType{DType::I64, {bt, n}}, 1), b.broadcast_in_dim(j, {bt, n}, {}));
      Value c = b.select(below, b.binary("divide", col, b.broadcast_in_dim(root, {bt, n}, {0})), b.zeros(col.type));
      Value outer = b.binary("multiply", b.broadcast_in_dim(c, {bt, n, n}, {0, 1}), b.broadcast_in_dim(c, {bt, n, n}, {0, 2}));
      return std::vector<Value>{b.binary("add", j, b.constant_int(1, DType::I64)), b.binary("subtract", m, outer),
                                next_info};
    };
    Value info = b.while_loop({b.constant_int(0, DType::I64), sym, b.zeros(f.type)}, cond, body)[2];
    // Where XLA failed and the loop, by rounding, did not: XLA's order.
    Value failed = b.compare(Cmp::NE, f, b.zeros(f.type));
    Value found = b.compare(Cmp::NE, info, b.zeros(info.type));
    return std::vector<Value>{b.select(failed, b.select(found, info, f), b.zeros(f.type))};
  };
  auto keep = [=](Builder&, const std::vector<Value>&) { return std::vector<Value>{f}; };
  Value r = b.op_multi("stablehlo.if", {any}, {f.type}, "", b.region({}, search) + ", " + b.region({}, keep))[0];
  return b.reshape(r, first.shape());
}

std::vector<Value> cholesky_ex(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out(0);
  real_only(ctx, out.dtype);
  bool upper = ctx.to_bool("upper", false);
  Value x = b.convert(ctx.tensor("self"), math_dtype(out.dtype));
  if (x.type.numel() == 0) return {b.zeros(out), b.zeros(ctx.out(1))};
  Value l = cholesky(b, x, !upper);
  Value info = cholesky_failed_order(b, x, !upper, cholesky_info(b, l));
  if (ctx.to_bool("check_errors", false))
    ctx.check_all(b.compare(Cmp::EQ, info, b.zeros(info.type)),
                  "linalg.cholesky: The factorization could not be completed because the input is not "
                  "positive-definite.", LoweringContext::CheckError::LinAlg);
  return {b.convert(l, out.dtype), b.reshape(info, ctx.out(1).shape)};
}

// cholesky(self, upper) (deprecated): the factor; raises where CPU does.
std::vector<Value> cholesky_op(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  real_only(ctx, out.dtype);
  Value x = b.convert(ctx.tensor("self"), math_dtype(out.dtype));
  if (x.type.numel() == 0) return {b.zeros(out)};
  Value l = cholesky(b, x, !ctx.to_bool("upper", false));
  Value info = cholesky_info(b, l);
  ctx.check_all(b.compare(Cmp::EQ, info, b.zeros(info.type)),
                "cholesky: The factorization could not be completed because the input is not positive-definite.",
                LoweringContext::CheckError::LinAlg);
  return {b.convert(l, out.dtype)};
}

// A solve's matrix and right-hand side, in the result's math dtype with its
// batch dims.
struct System {
  Value a, rhs;
};
System system(LoweringContext& ctx, const char* a, const char* rhs) {
  const TensorType& out = ctx.out(0);
  DType dt = math_dtype(out.dtype);
  Shape batch = batch_of(out.shape);
  return {with_batch(ctx.b, ctx.b.convert(ctx.tensor(a), dt), batch),
          with_batch(ctx.b, ctx.b.convert(ctx.tensor(rhs), dt), batch)};
}

std::vector<Value> solve_triangular(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  real_only(ctx, out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  System sys = system(ctx, "self", "B");
  Value x = triangular_solve(b, sys.a, sys.rhs, ctx.to_bool("left", true), !ctx.to_bool("upper", false),
                  ctx.to_bool("unitriangular", false), false);
  return {b.convert(x, out.dtype)};
}

// triangular_solve(self=B, A, upper, transpose, unitriangular) ->
// (solution of op(A) X = B, A broadcast).
std::vector<Value> triangular_solve_op(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out(0);
  real_only(ctx, out.dtype);
  Value coefficient = b.convert(b.broadcast_to(ctx.tensor("A"), ctx.out(1).shape), ctx.out(1).dtype);
  if (out.numel() == 0) return {b.zeros(out), coefficient};
  System sys = system(ctx, "A", "self");
  Value x = triangular_solve(b, sys.a, sys.rhs, true, !ctx.to_bool("upper", true), ctx.to_bool("unitriangular", false),
                  ctx.to_bool("transpose", false));
  return {b.convert(x, out.dtype), coefficient};
}

// X with A A^T X = B for A = L (lower) or U^T U X = B for A = U (upper).
Value cholesky_solve(Builder& b, const Value& factor, const Value& rhs, bool upper) {
  Value y = triangular_solve(b, factor, rhs, true, !upper, false, upper);
  return triangular_solve(b, factor, y, true, !upper, false, !upper);
}

// _cholesky_solve_helper(self=B, A=factor, upper): batch dims already broadcast.
std::vector<Value> cholesky_solve_helper(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  real_only(ctx, out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  System sys = system(ctx, "A", "self");
  return {b.convert(cholesky_solve(b, sys.a, sys.rhs, ctx.to_bool("upper", false)), out.dtype)};
}

// cholesky_inverse(factor, upper) = (L L^T)^-1: cholesky_solve of the identity.
std::vector<Value> cholesky_inverse(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  real_only(ctx, out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  DType dt = math_dtype(out.dtype);
  Value f = b.convert(ctx.tensor("self"), dt);
  Value eye = identity_like(b, TensorType{dt, f.shape()});
  return {b.convert(cholesky_solve(b, f, eye, ctx.to_bool("upper", false)), out.dtype)};
}

// _linalg_check_errors(info, api_name, is_matrix) in a compiled graph (eager
// keeps PyTorch's kernel: lowering_routes.cpp): a device check that every
// info is 0, raised at the next host read with CPU's message for the api,
// less the failing order and batch element the data would give.
std::vector<Value> check_errors(LoweringContext& ctx) {
  const Value& info = ctx.tensor("info");
  std::string api = ctx.str("api_name");
  auto has = [&](const char* s) { return api.find(s) != std::string::npos; };
  std::string why = "Unknown error code.";
  LoweringContext::CheckError kind = LoweringContext::CheckError::LinAlg;
  if (has("solve")) {
    why = "The solver failed because the input matrix is singular.";
  } else if (has("inv")) {
    why = "A diagonal element is zero, the inversion could not be completed because the input matrix is singular.";
  } else if (has("cholesky")) {
    why = "The factorization could not be completed because the input is not positive-definite.";
  } else if (has("lu_factor")) {
    why = "A diagonal element of U is zero and using it on lu_solve would result in a division by zero.";
    kind = LoweringContext::CheckError::Runtime;  // (CPU's lu_factor raises a plain RuntimeError)
  } else if (has("eig") || has("syevd") || has("svd")) {
    why = "The algorithm failed to converge because the input matrix is ill-conditioned.";
  } else if (has("lstsq")) {
    why = "The least squares solution could not be computed because the input matrix does not have full rank.";
  }
  if (info.type.numel() > 0)
    ctx.check_all(ctx.b.compare(Cmp::EQ, info, ctx.b.zeros(info.type)), api + ": " + why, kind);
  return {};
}

}  // namespace

TORCH_PJRT_LOWERING("_linalg_check_errors", check_errors);
TORCH_PJRT_LOWERING("linalg_cholesky_ex", cholesky_ex);
TORCH_PJRT_LOWERING("cholesky", cholesky_op);
TORCH_PJRT_LOWERING("linalg_solve_triangular", solve_triangular);
TORCH_PJRT_LOWERING("triangular_solve", triangular_solve_op);
TORCH_PJRT_LOWERING("_cholesky_solve_helper", cholesky_solve_helper);
TORCH_PJRT_LOWERING("cholesky_inverse", cholesky_inverse);

}  // namespace torch_pjrt::lowering::ops
