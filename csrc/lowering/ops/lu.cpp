// LU factorization with partial pivoting and what is built on it:
// linalg_lu_factor_ex, linalg_lu, lu_unpack, linalg_lu_solve, _linalg_solve_ex
// (linalg.solve), linalg_inv_ex, _linalg_det and _linalg_slogdet.
//
// The factorization is LAPACK's getrf in stablehlo.while loops (the
// program's size does not grow with n): column steps pick the pivot as the
// first row of largest magnitude at or below the diagonal (as idamax does),
// swap rows, divide the column below the pivot by it and update the rest of
// their panel; from order 16 on, panels of 8 columns are factored so and the
// trailing matrix is updated by a matrix product per panel (see factorize).
// Pivots are 1-based int32 and `info` is the first zero pivot's order, as
// LAPACK gives. Static shapes make each panel pass over the whole matrix, so
// large orders stay slower than the CPU's LAPACK (benchmarks/linalg.py).
// Real dtypes (complex ones take the CPU fallback); half types in float32.
#include <algorithm>
#include <optional>
#include <string>

#include "lowering/ops/linalg.h"

namespace torch_pjrt::lowering::ops {
namespace {

Value i64(Builder& b, int64_t v) { return b.constant_int(v, DType::I64); }

// Rows rows[t, i] of x[t] for every batch t: x [bt, m, c], rows [bt, q] -> [bt, q, c].
// One (batch, row) index pair per row, whole rows as slices.
Value take_rows(Builder& b, const Value& x, const Value& rows) {
  int64_t bt = x.shape()[0], c = x.shape()[2], q = rows.shape()[1];
  Shape s{bt, q, 1};
  TensorType it{DType::I64, s};
  Value ix = b.concatenate({b.iota(it, 0), b.reshape(b.convert(rows, DType::I64), s)}, 2);
  return b.op("stablehlo.gather", {x, ix}, TensorType{x.dtype(), {bt, q, c}},
              "dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0, 1], "
              "start_index_map = [0, 1], index_vector_dim = 2>, slice_sizes = array<i64: 1, 1, " +
                  std::to_string(c) + ">, indices_are_sorted = false");
}

// Element idx[t] of v[t]: v [bt, m], idx [bt] i64 -> [bt].
Value take_each(Builder& b, const Value& v, const Value& idx) {
  int64_t bt = v.shape()[0];
  Shape s{bt, 1};
  Value ix = b.concatenate({b.iota(TensorType{DType::I64, s}, 0), b.reshape(idx, s)}, 1);
  return b.gather_elements(v, ix);
}

// Column j (a runtime 0-d i64) of x [bt, m, n] -> [bt, m].
Value column(Builder& b, const Value& x, const Value& j) {
  Value zero = i64(b, 0);
  return b.reshape(b.dynamic_slice(x, {zero, zero, j}, {x.shape()[0], x.shape()[1], 1}),
                   {x.shape()[0], x.shape()[1]});
}

struct Factor {
  Value lu;      // [bt, m, n]: L below the diagonal (unit diagonal implied), U on and above
  Value pivots;  // [bt, k] int32, 1-based: row j was swapped with row pivots[j] - 1
  Value info;    // [bt] int32: 0, or the 1-based order of the first zero pivot
};

// A while loop's condition: its counter (the first carried value) < limit.
Builder::LoopFn below_limit(const Value& limit) {
  return [limit](Builder& b, const std::vector<Value>& s) {
    return std::vector<Value>{b.compare(Cmp::LT, s[0], limit)};
  };
}

// The row order perm [bt, m] i64 after LAPACK's swaps from..to-1 (0-d i64):
// swap j exchanges entries j and piv[t, j] (0-based, [bt, k] i64).
Value apply_swaps(Builder& b, const Value& perm, const Value& piv, const Value& from, const Value& to) {
  const int64_t bt = perm.shape()[0], m = perm.shape()[1];
  auto body = [=](Builder& b, const std::vector<Value>& s) {
    const Value &j = s[0], &p = s[1];
    Value other = take_each(b, piv, b.broadcast_in_dim(j, {bt}, {}));
    Value at_j = take_each(b, p, b.broadcast_in_dim(j, {bt}, {})), at_other = take_each(b, p, other);
    Value rows = b.iota(TensorType{DType::I64, {bt, m}}, 1);
    Value next = b.select(b.compare(Cmp::EQ, rows, b.broadcast_in_dim(j, {bt, m}, {})),
                          b.broadcast_in_dim(at_other, {bt, m}, {0}),
                          b.select(b.compare(Cmp::EQ, rows, b.broadcast_in_dim(other, {bt, m}, {0})),
                                   b.broadcast_in_dim(at_j, {bt, m}, {0}), p));
    return std::vector<Value>{b.binary("add", j, i64(b, 1)), next};
  };
  return b.while_loop({from, perm}, below_limit(to), body)[1];
}

// 1-based int32 pivots as 0-based int64 row numbers.
Value zero_based(Builder& b, const Value& pivots) {
  TensorType t{DType::I64, pivots.shape()};
  return b.binary("subtract", b.convert(pivots, DType::I64), b.splat(Scalar::from_int(1), t));
}

// One column step of getrf on x [bt, M, W]: row j (global) and column c of
// x (c = j in the column loop, j - j0 in a panel), a 0-d i64 each. The pivot
// is searched among rows j..m-1 (rows from m on are padding). Returns the
// next x, the pivot row p [bt] i64 and the pivot value d [bt].
struct Step {
  Value x, p, d;
};

Step column_step(Builder& b, const Value& x, const Value& j, const Value& c, int64_t m, bool pivot) {
  const int64_t bt = x.shape()[0], rows = x.shape()[1], cols = x.shape()[2];
  const DType dt = x.dtype();
  const Shape vec{bt, rows}, full{bt, rows, cols};
  Value row_of_vec = b.iota(TensorType{DType::I64, vec}, 1);
  Value j_vec = b.broadcast_in_dim(j, vec, {});
  Value j_batch = b.broadcast_in_dim(j, {bt}, {});
  Value c_batch = b.broadcast_in_dim(c, {bt}, {});
  Value p = j_batch;  // [bt] i64: the pivot row
  if (pivot) {
    Value below = b.compare(Cmp::GE, row_of_vec, j_vec);
    if (m < rows) below = b.binary("and", below, b.compare(Cmp::LT, row_of_vec, b.splat(Scalar::from_int(m), row_of_vec.type)));
    Value mag = b.select(below, b.unary("abs", column(b, x, c)), b.splat(Scalar::from_float(-1.0), {dt, vec}));
    Value top = b.reduce(mag, b.constant(-1.0, dt), {1}, "stablehlo.maximum");
    Value hit = b.binary("and", below, b.compare(Cmp::EQ, mag, b.broadcast_in_dim(top, vec, {0})));
    Value none = b.splat(Scalar::from_int(rows), {DType::I64, vec});
    Value first = b.reduce(b.select(hit, row_of_vec, none), i64(b, rows), {1}, "stablehlo.minimum");
    // No candidate (a NaN column): keep row j, as idamax does.
    p = b.select(b.compare(Cmp::EQ, first, b.splat(Scalar::from_int(rows), first.type)), j_batch, first);
  }
  // Swap rows j and p.
  Value zero = i64(b, 0);
  Value row_j = b.reshape(b.dynamic_slice(x, {zero, j, zero}, {bt, 1, cols}), {bt, cols});
  Value row_p = b.reshape(take_rows(b, x, b.reshape(p, {bt, 1})), {bt, cols});
  TensorType full_i{DType::I64, full};
  Value r3 = b.iota(full_i, 1), c3 = b.iota(full_i, 2);
  Value j3 = b.broadcast_in_dim(j, full, {}), cc3 = b.broadcast_in_dim(c, full, {});
  Value rp = b.broadcast_in_dim(row_p, full, {0, 2});
  Value swapped = b.select(b.compare(Cmp::EQ, r3, j3), rp,
                           b.select(b.compare(Cmp::EQ, r3, b.broadcast_in_dim(p, full, {0})),
                                    b.broadcast_in_dim(row_j, full, {0, 2}), x));
  // Multipliers below the pivot, then the rank-1 update of the trailing block.
  Value d = take_each(b, row_p, c_batch);  // [bt]
  Value col = column(b, swapped, c);
  Value d_vec = b.broadcast_in_dim(d, vec, {0});
  Value d_zero = b.compare(Cmp::EQ, d_vec, b.zeros(d_vec.type));
  Value l = b.broadcast_in_dim(b.select(d_zero, col, b.binary("divide", col, d_vec)), full, {0, 1});
  Value below3 = b.compare(Cmp::GT, r3, j3);
  Value update = b.binary("subtract", swapped, b.binary("multiply", l, rp));
  Value next = b.select(b.binary("and", below3, b.compare(Cmp::GT, c3, cc3)), update,
                        b.select(b.binary("and", below3, b.compare(Cmp::EQ, c3, cc3)), l, swapped));
  return {next, p, d};
}

// The pivot record (1-based, at j) and `info` (the first zero pivot's
// 1-based order) after the step at row j: piv [bt, k] i32, info [bt] i32.
std::pair<Value, Value> record_pivot(Builder& b, const Step& st, const Value& j, const Value& piv,
                                     const Value& info) {
  const int64_t bt = piv.shape()[0], k = piv.shape()[1];
  Value j_batch = b.broadcast_in_dim(j, {bt}, {});
  Value at_j = b.compare(Cmp::EQ, b.iota(TensorType{DType::I64, {bt, k}}, 1), b.broadcast_in_dim(j, {bt, k}, {}));
  Value p1 = b.convert(b.binary("add", st.p, b.splat(Scalar::from_int(1), st.p.type)), DType::I32);
  Value next_piv = b.select(at_j, b.broadcast_in_dim(p1, {bt, k}, {0}), piv);
  Value first_zero = b.binary("and", b.compare(Cmp::EQ, st.d, b.zeros(st.d.type)),
                              b.compare(Cmp::EQ, info, b.zeros(info.type)));
  Value order = b.convert(b.binary("add", j_batch, b.splat(Scalar::from_int(1), j_batch.type)), DType::I32);
  return {next_piv, b.select(first_zero, order, info)};
}

// Columns per panel of the blocked factorization, and the order from which
// it is used. On the CPU plugin (process CPU time of a det of 16 matrices,
// n = 256): no panels 668 ms, panels of 32 175 ms, 16 110 ms, 8 62 ms, 4
// 67 ms; a column step costs in proportion to its panel, and the panel's
// passes over the whole matrix in proportion to the number of panels.
constexpr int64_t kPanel = 8;
constexpr int64_t kBlockedFrom = 16;

// getrf, right-looking as LAPACK's dgetrf. Small orders: one column step per
// loop iteration over the whole m x n block. Larger ones: a loop over panels
// of kPanel columns; each panel is factored by column steps on its own
// [m, kPanel] slice, its row swaps are applied to the other columns by one
// gather, then U12 = L11^-1 A12 and A22 -= L21 U12 (a forward substitution
// and one matrix product per panel). Shapes are static, so the panel's rows
// above it and the columns left of the trailing block are masked, not
// sliced, and the matrix is padded by a panel on each side so that no
// dynamic slice is clamped. Same pivots and `info` as the column loop up to
// rounding; the program's size does not grow with n.
Factor factorize(Builder& b, const Value& a, bool pivot) {
  const int64_t bt = a.shape()[0], m = a.shape()[1], n = a.shape()[2], k = std::min(m, n);
  const DType dt = a.dtype();
  TensorType piv_t{DType::I32, {bt, k}};
  if (a.type.numel() == 0) {  // nothing to factor (slices of size 1 would not fit): no swaps, no zero pivot
    return {a, b.binary("add", b.iota(piv_t, 1), b.splat(Scalar::from_int(1), piv_t)),
            b.zeros(TensorType{DType::I32, {bt}})};
  }
  Value info0 = b.zeros(TensorType{DType::I32, {bt}});
  // Column steps over (j, x, pivots, info); x's column j - col0 is column j.
  auto column_steps = [=](const std::optional<Value>& col0) {
    return [=](Builder& b, const std::vector<Value>& s) {
      Step st = column_step(b, s[1], s[0], col0 ? b.binary("subtract", s[0], *col0) : s[0], m, pivot);
      auto [piv, info] = record_pivot(b, st, s[0], s[2], s[3]);
      return std::vector<Value>{b.binary("add", s[0], i64(b, 1)), st.x, piv, info};
    };
  };
  if (k < kBlockedFrom) {
    std::vector<Value> r =
        b.while_loop({i64(b, 0), a, b.zeros(piv_t), info0}, below_limit(i64(b, k)), column_steps(std::nullopt));
    return {r[1], r[2], r[3]};
  }
  const int64_t w = kPanel, M = m + w, N = n + w;
  Value x0 = b.pad(a, b.constant(0.0, dt), {0, 0, 0}, {0, w, w});
  auto panel_body = [=](Builder& b, const std::vector<Value>& s) {
    const Value &j0 = s[0], &x = s[1];
    Value zero = i64(b, 0);
    Value end = b.binary("minimum", b.binary("add", j0, i64(b, w)), i64(b, k));
    // The panel's column steps, on its [M, w] slice.
    Value panel0 = b.dynamic_slice(x, {zero, zero, j0}, {bt, M, w});
    std::vector<Value> f = b.while_loop({j0, panel0, s[2], s[3]}, below_limit(end), column_steps(j0));
    const Value &panel = f[1], &piv = f[2];
    Value y = x;
    if (pivot)  // the panel's swaps, in order, as one row permutation of the whole matrix
      y = take_rows(b, x, apply_swaps(b, b.iota(TensorType{DType::I64, {bt, M}}, 1), zero_based(b, piv), j0, end));
    // The factored panel in place (its rows were swapped by its steps).
    y = b.dynamic_update_slice_at(y, panel, {zero, zero, j0});
    // U12 = L11^-1 A12 in the panel's rows, right of the panel.
    Value next_j0 = b.binary("add", j0, i64(b, w));
    Value l11 = b.dynamic_slice(panel, {zero, j0, zero}, {bt, w, w});
    Value a12 = b.dynamic_slice(y, {zero, j0, zero}, {bt, w, N});
    // Forward substitution, unrolled over the panel's rows. (XLA's
    // triangular_solve multiplies by inverted blocks, which turns one inf of
    // A12 into NaN in rows above it; LAPACK's trsm leaves those rows finite.)
    Value u12 = a12;
    for (int64_t i = 0; i + 1 < w; ++i) {
      Value li = b.slice(l11, {0, i + 1, i}, {bt, w, i + 1});    // [bt, w-i-1, 1]
      Value xi = b.slice(u12, {0, i, 0}, {bt, i + 1, N});        // [bt, 1, N]
      Value below = b.slice(u12, {0, i + 1, 0}, {bt, w, N});
      below = b.binary("subtract", below, b.binary("multiply", b.broadcast_in_dim(b.reshape(li, {bt, w - i - 1}), {bt, w - i - 1, N}, {0, 1}),
                                                   b.broadcast_in_dim(b.reshape(xi, {bt, N}), {bt, w - i - 1, N}, {0, 2})));
      u12 = b.concatenate({b.slice(u12, {0, 0, 0}, {bt, i + 1, N}), below}, 1);
    }
    TensorType ri{DType::I64, {bt, w, N}};
    Value right = b.compare(Cmp::GE, b.iota(ri, 2), b.broadcast_in_dim(next_j0, ri.shape, {}));
    y = b.dynamic_update_slice_at(y, b.select(right, u12, a12), {zero, j0, zero});
    // A22 -= L21 U12; the masked-out products are discarded (0 * inf would be NaN).
    TensorType li{DType::I64, {bt, M, w}};
    Value l21 = b.select(b.compare(Cmp::GE, b.iota(li, 1), b.broadcast_in_dim(next_j0, li.shape, {})), panel,
                         b.zeros(panel.type));
    Value prod = b.dot_general(l21, b.select(right, u12, b.zeros(u12.type)), {0}, {0}, {2}, {1}, dt);
    TensorType fi{DType::I64, {bt, M, N}};
    Value start = b.broadcast_in_dim(next_j0, fi.shape, {});
    Value trailing = b.binary("and", b.compare(Cmp::GE, b.iota(fi, 1), start), b.compare(Cmp::GE, b.iota(fi, 2), start));
    y = b.select(trailing, b.binary("subtract", y, prod), y);
    return std::vector<Value>{next_j0, y, piv, f[3]};
  };
  std::vector<Value> r = b.while_loop({i64(b, 0), x0, b.zeros(piv_t), info0}, below_limit(i64(b, k)), panel_body);
  return {b.slice(r[1], {0, 0, 0}, {bt, m, n}), r[2], r[3]};
}

// The row order LAPACK's swaps give: perm[t, i] is the row of A that is row
// i of L U (P^T A = L U). pivots [bt, k] (1-based) -> [bt, m] i64.
Value permutation(Builder& b, const Value& pivots, int64_t m) {
  const int64_t bt = pivots.shape()[0], k = pivots.shape()[1];
  Value identity = b.iota(TensorType{DType::I64, {bt, m}}, 1);
  // Out-of-range pivots (user-made ones; LAPACK does not check) are clamped by the gathers.
  if (bt * m == 0 || k == 0) return identity;
  return apply_swaps(b, identity, zero_based(b, pivots), i64(b, 0), i64(b, k));
}

// inverse[t, perm[t, i]] = i.
Value inverse_permutation(Builder& b, const Value& perm) {
  const int64_t bt = perm.shape()[0], m = perm.shape()[1];
  Shape s{bt, m, 1};
  Value ix = b.concatenate({b.iota(TensorType{DType::I64, s}, 0), b.reshape(perm, s)}, 2);
  return b.scatter_elements(b.zeros(perm.type), ix, b.iota(perm.type, 1));
}

// X with A X = rhs (A^T X = rhs when `adjoint`), A = P L U given by its
// factor lu [bt, n, n] and row order perm [bt, n]; rhs [bt, n, r].
// (stablehlo.triangular_solve reads only the triangle it is told to.)
Value lu_solve(Builder& b, const Value& lu, const Value& perm, const Value& rhs, bool adjoint) {
  if (!adjoint) {
    Value y = triangular_solve(b, lu, take_rows(b, rhs, perm), true, true, true, false);
    return triangular_solve(b, lu, y, true, false, false, false);
  }
  Value z = triangular_solve(b, lu, rhs, true, false, false, true);  // U^T z = rhs
  z = triangular_solve(b, lu, z, true, true, true, true);            // L^T w = z
  return take_rows(b, z, inverse_permutation(b, perm));              // P w
}

// `x` [batch..., r, c] as [bt, r, c] in `dt`, its batch dims broadcast to `batch`.
Value batched(Builder& b, const Value& x, const Shape& batch, DType dt) {
  return flatten_batch(b, with_batch(b, b.convert(x, dt), batch), 2);
}

Shape with_dims(Shape batch, std::initializer_list<int64_t> dims) {
  batch.insert(batch.end(), dims);
  return batch;
}

// L (unit lower, m x k) and U (upper, k x n) of a factor [.., m, n].
std::pair<Value, Value> unpack_factor(Builder& b, const Value& lu) {
  const Shape& s = lu.shape();
  int64_t r = lu.rank(), m = s[r - 2], n = s[r - 1], k = std::min(m, n);
  Shape zero(r, 0), lim_l = s, lim_u = s;
  lim_l[r - 1] = k;
  lim_u[r - 2] = k;
  Value l = b.slice(lu, zero, lim_l), u = b.slice(lu, zero, lim_u);
  TensorType li{DType::I64, l.shape()};
  Value row = b.iota(li, r - 2), col = b.iota(li, r - 1);
  l = b.select(b.compare(Cmp::GT, row, col), l,
               b.select(b.compare(Cmp::EQ, row, col), b.splat(Scalar::from_int(1), l.type), b.zeros(l.type)));
  return {l, triangle(b, u, false)};
}

// The permutation matrix P (A = P L U) of a row order perm [bt, m], in `dt`.
Value permutation_matrix(Builder& b, const Value& perm, DType dt) {
  const int64_t bt = perm.shape()[0], m = perm.shape()[1];
  Shape s{bt, m, m};
  Value hit = b.compare(Cmp::EQ, b.iota(TensorType{DType::I64, s}, 1), b.broadcast_in_dim(perm, s, {0, 2}));
  return b.convert(hit, dt);
}

// check_errors=True: CPU raises LinAlgError (lu_factor_ex: RuntimeError).
void check_info(LoweringContext& ctx, const Value& info, const std::string& message,
                LoweringContext::CheckError kind = LoweringContext::CheckError::LinAlg) {
  if (ctx.to_bool("check_errors", false))
    ctx.check_all(ctx.b.compare(Cmp::EQ, info, ctx.b.zeros(info.type)), message, kind);
}

const char* const kSingular = ": The solver failed because the input matrix is singular.";

// linalg_lu_factor_ex(A, pivot, check_errors) -> (LU, pivots, info)
std::vector<Value> lu_factor_ex(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType &lu_t = ctx.out(0), &piv_t = ctx.out(1), &info_t = ctx.out(2);
  real_only(ctx, lu_t.dtype);
  if (lu_t.numel() == 0) return {b.zeros(lu_t), b.zeros(piv_t), b.zeros(info_t)};
  Factor f = factorize(b, batched(b, ctx.tensor("A"), batch_of(lu_t.shape), math_dtype(lu_t.dtype)),
                       ctx.to_bool("pivot", true));
  Value info = b.reshape(f.info, info_t.shape);
  check_info(ctx, info, "torch.linalg.lu_factor_ex: a diagonal element of U is zero; using it on lu_solve "
                        "would result in a division by zero", LoweringContext::CheckError::Runtime);
  return {b.convert(b.reshape(f.lu, lu_t.shape), lu_t.dtype), b.reshape(f.pivots, piv_t.shape), info};
}

// (P, L, U) outputs; an output PyTorch left empty stays empty.
std::vector<Value> plu(Builder& b, const std::vector<TensorType>& outs, const Value& lu, const Value& perm) {
  std::vector<Value> r;
  if (outs[0].numel() == 0) r.push_back(b.zeros(outs[0]));
  else r.push_back(b.convert(b.reshape(permutation_matrix(b, perm, lu.dtype()), outs[0].shape), outs[0].dtype));
  if (outs[1].numel() == 0 && outs[2].numel() == 0) return {r[0], b.zeros(outs[1]), b.zeros(outs[2])};
  auto [l, u] = unpack_factor(b, lu);
  r.push_back(b.convert(b.reshape(l, outs[1].shape), outs[1].dtype));
  r.push_back(b.convert(b.reshape(u, outs[2].shape), outs[2].dtype));
  return r;
}

// linalg_lu(A, pivot) -> (P, L, U); P is empty without pivoting.
std::vector<Value> linalg_lu(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& l_t = ctx.out(1);
  real_only(ctx, l_t.dtype);
  const Value& a = ctx.tensor("A");
  DType dt = math_dtype(l_t.dtype);
  Value x = flatten_batch(b, b.convert(a, dt), 2);  // (an empty A: the loop runs no step, P = I)
  Factor f = factorize(b, x, ctx.to_bool("pivot", true));
  Value lu = b.reshape(f.lu, a.shape());
  return plu(b, ctx.outputs, lu, permutation(b, f.pivots, x.shape()[1]));
}

// lu_unpack(LU_data, LU_pivots, unpack_data, unpack_pivots) -> (P, L, U)
std::vector<Value> lu_unpack(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& lu = ctx.tensor("LU_data");
  real_only(ctx, lu.dtype());
  Value perm;
  if (ctx.outputs[0].numel() > 0) {
    Value piv = flatten_batch(b, ctx.tensor("LU_pivots"), 1);
    perm = permutation(b, piv, lu.shape()[lu.rank() - 2]);
  }
  return plu(b, ctx.outputs, lu, perm);
}

// B as a matrix rhs [bt, n, r] for a solve with result type `out`: a vector
// rhs (result rank one less than its factor's) gains a trailing 1.
Value rhs_matrix(Builder& b, const Value& rhs, const TensorType& out, bool vector, DType dt) {
  Shape s = out.shape;
  if (vector) s.push_back(1);
  Value x = b.convert(rhs, dt);
  if (vector) {
    Shape xs = x.shape();
    xs.push_back(1);
    x = b.reshape(x, xs);
  }
  return flatten_batch(b, b.broadcast_to(x, s), 2);
}

// A X = B (left) or X A = B with X A = B <=> A^T X^T = B^T; lu [bt, n, n].
Value solve_with(Builder& b, const Value& lu, const Value& perm, const Value& rhs, bool left, bool adjoint) {
  if (left) return lu_solve(b, lu, perm, rhs, adjoint);
  Value t = lu_solve(b, lu, perm, b.transpose(rhs, {0, 2, 1}), !adjoint);
  return b.transpose(t, {0, 2, 1});
}

// linalg_lu_solve(LU, pivots, B, left, adjoint) -> X
std::vector<Value> lu_solve_op(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  real_only(ctx, out.dtype);
  if (out.numel() == 0) return {b.zeros(out)};
  DType dt = math_dtype(out.dtype);
  Shape batch = batch_of(out.shape);
  Value lu = batched(b, ctx.tensor("LU"), batch, dt);
  Value piv = ctx.tensor("pivots");
  Shape piv_s = batch;
  piv_s.push_back(piv.shape().back());
  piv = flatten_batch(b, b.broadcast_to(piv, piv_s), 1);
  Value perm = permutation(b, piv, lu.shape()[1]);
  Value rhs = flatten_batch(b, b.broadcast_to(b.convert(ctx.tensor("B"), dt), out.shape), 2);
  Value x = solve_with(b, lu, perm, rhs, ctx.to_bool("left", true), ctx.to_bool("adjoint", false));
  return {b.convert(b.reshape(x, out.shape), out.dtype)};
}

// _linalg_solve_ex(A, B, left, check_errors) -> (result, LU, pivots, info);
// LU and pivots are A's (linalg.solve's backward solves with them, adjoint).
std::vector<Value> solve_ex(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType &out = ctx.out(0), &lu_t = ctx.out(1), &piv_t = ctx.out(2), &info_t = ctx.out(3);
  real_only(ctx, out.dtype);
  DType dt = math_dtype(out.dtype);
  bool left = ctx.to_bool("left", true);
  bool vector = out.rank() == lu_t.rank() - 1;
  if (lu_t.numel() == 0)
    return {b.zeros(out), b.zeros(lu_t), b.zeros(piv_t), b.zeros(info_t)};
  Value a = batched(b, ctx.tensor("A"), batch_of(lu_t.shape), dt);
  Factor f = factorize(b, a, true);
  Value info = b.reshape(f.info, info_t.shape);
  check_info(ctx, info, std::string("torch.linalg.solve_ex") + kSingular);
  Value result;
  if (out.numel() == 0) {
    result = b.zeros(out);
  } else {
    Shape batch = batch_of(vector ? with_dims(out.shape, {1}) : out.shape);
    int64_t n = lu_t.shape.back();
    Value lu = flatten_batch(b, with_batch(b, b.reshape(f.lu, lu_t.shape), batch), 2);
    Shape piv_s = batch;
    piv_s.push_back(n);
    Value piv = flatten_batch(b, b.broadcast_to(b.reshape(f.pivots, piv_t.shape), piv_s), 1);
    Value rhs = rhs_matrix(b, ctx.tensor("B"), out, vector, dt);
    Value x = solve_with(b, lu, permutation(b, piv, n), rhs, left, false);
    result = b.convert(b.reshape(x, out.shape), out.dtype);
  }
  return {result, b.convert(b.reshape(f.lu, lu_t.shape), lu_t.dtype), b.reshape(f.pivots, piv_t.shape), info};
}

// linalg_inv_ex(A, check_errors) -> (inverse, info): A X = I.
std::vector<Value> inv_ex(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType &out = ctx.out(0), &info_t = ctx.out(1);
  real_only(ctx, out.dtype);
  if (out.numel() == 0) return {b.zeros(out), b.zeros(info_t)};
  DType dt = math_dtype(out.dtype);
  Value a = flatten_batch(b, b.convert(ctx.tensor("A"), dt), 2);
  Factor f = factorize(b, a, true);
  Value info = b.reshape(f.info, info_t.shape);
  check_info(ctx, info, "linalg.inv_ex: The diagonal element is zero, the inversion could not be completed "
                        "because the input matrix is singular.");
  Value x = lu_solve(b, f.lu, permutation(b, f.pivots, a.shape()[1]), identity_like(b, a.type), false);
  return {b.convert(b.reshape(x, out.shape), out.dtype), info};
}

// The factor of A for det and slogdet. As CPU does, a contiguous A is
// factored transposed (det(A^T) = det(A)); their backward formulas solve with
// this LU accordingly (adjoint = !A.is_contiguous()).
Factor det_factor(LoweringContext& ctx, DType dt) {
  Value a = flatten_batch(ctx.b, ctx.b.convert(ctx.tensor("A"), dt), 2);
  if (ctx.arg("A").contiguous) a = ctx.b.transpose(a, {0, 2, 1});
  return factorize(ctx.b, a, true);
}

// det(P) prod(diag(U)) pieces of a square factor: (diag(U) [bt, n], the
// permutation's sign [bt], +1 or -1 in dt).
std::pair<Value, Value> det_parts(Builder& b, const Factor& f) {
  const int64_t bt = f.lu.shape()[0], n = f.lu.shape()[1];
  TensorType it{DType::I64, f.lu.shape()};
  Value on_diag = b.compare(Cmp::EQ, b.iota(it, 1), b.iota(it, 2));
  Value diag = b.reduce(b.select(on_diag, f.lu, b.zeros(f.lu.type)), b.constant(0.0, f.lu.dtype()), {2},
                        "stablehlo.add");
  // Each pivot row other than its own is one swap.
  TensorType pt{DType::I32, {bt, n}};
  Value own = b.convert(b.binary("add", b.iota(pt, 1), b.splat(Scalar::from_int(1), pt)), DType::I32);
  Value swaps = b.reduce(b.convert(b.compare(Cmp::NE, f.pivots, own), DType::I32), b.constant_int(0, DType::I32),
                         {1}, "stablehlo.add");
  Value odd = b.compare(Cmp::EQ, b.binary("and", swaps, b.splat(Scalar::from_int(1), swaps.type)),
                        b.splat(Scalar::from_int(1), swaps.type));
  TensorType st{f.lu.dtype(), {bt}};
  Value sign = b.select(odd, b.splat(Scalar::from_float(-1.0), st), b.splat(Scalar::from_float(1.0), st));
  return {diag, sign};
}

// _linalg_det(A) -> (det, LU, pivots)
std::vector<Value> det(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType &out = ctx.out(0), &lu_t = ctx.out(1), &piv_t = ctx.out(2);
  real_only(ctx, out.dtype);
  DType dt = math_dtype(out.dtype);
  const Value& a0 = ctx.tensor("A");
  if (a0.type.numel() == 0)  // det of a 0 x 0 matrix is 1
    return {b.convert(b.splat(Scalar::from_float(1.0), {dt, out.shape}), out.dtype), b.zeros(lu_t), b.zeros(piv_t)};
  Factor f = det_factor(ctx, dt);
  auto [diag, sign] = det_parts(b, f);
  Value prod = b.reduce(diag, b.constant(1.0, dt), {1}, "stablehlo.multiply");
  Value d = b.binary("multiply", sign, prod);
  return {b.convert(b.reshape(d, out.shape), out.dtype), b.convert(b.reshape(f.lu, lu_t.shape), lu_t.dtype),
          b.reshape(f.pivots, piv_t.shape)};
}

// _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots)
std::vector<Value> slogdet(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType &sign_t = ctx.out(0), &log_t = ctx.out(1), &lu_t = ctx.out(2), &piv_t = ctx.out(3);
  real_only(ctx, sign_t.dtype);
  DType dt = math_dtype(sign_t.dtype);
  const Value& a0 = ctx.tensor("A");
  if (a0.type.numel() == 0)
    return {b.convert(b.splat(Scalar::from_float(1.0), {dt, sign_t.shape}), sign_t.dtype), b.zeros(log_t),
            b.zeros(lu_t), b.zeros(piv_t)};
  Factor f = det_factor(ctx, dt);
  auto [diag, sign] = det_parts(b, f);
  Value diag_sign = b.reduce(b.unary("sign", diag), b.constant(1.0, dt), {1}, "stablehlo.multiply");
  Value logabs = b.reduce(b.unary("log", b.unary("abs", diag)), b.constant(0.0, dt), {1}, "stablehlo.add");
  Value s = b.binary("multiply", sign, diag_sign);
  return {b.convert(b.reshape(s, sign_t.shape), sign_t.dtype), b.convert(b.reshape(logabs, log_t.shape), log_t.dtype),
          b.convert(b.reshape(f.lu, lu_t.shape), lu_t.dtype), b.reshape(f.pivots, piv_t.shape)};
}

}  // namespace

TORCH_PJRT_LOWERING("linalg_lu_factor_ex", lu_factor_ex);
TORCH_PJRT_LOWERING("linalg_lu", linalg_lu);
TORCH_PJRT_LOWERING("lu_unpack", lu_unpack);
TORCH_PJRT_LOWERING("linalg_lu_solve", lu_solve_op);
TORCH_PJRT_LOWERING("_linalg_solve_ex", solve_ex);
TORCH_PJRT_LOWERING("linalg_inv_ex", inv_ex);
TORCH_PJRT_LOWERING("_linalg_det", det);
TORCH_PJRT_LOWERING("_linalg_slogdet", slogdet);

}  // namespace torch_pjrt::lowering::ops
