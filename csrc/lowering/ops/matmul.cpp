// Matrix products: mm, bmm, mv, dot and their add* forms. matmul, linear and
// einsum decompose into these in PyTorch before reaching the backend.
// float16/bfloat16 operands are multiplied and accumulated in float32 (then
// rounded once by the executor's conversion to the result dtype).
#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

DType acc_dtype(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

// The Meta kernels do not check this; CPU raises.
void check_same_dtype(const LoweringContext& ctx, const Value& a, const Value& b) {
  if (a.dtype() != b.dtype())
    ctx.fail(std::string("expected m1 and m2 to have the same dtype, but got: ") + dtype_name(a.dtype()) +
             " != " + dtype_name(b.dtype()));
}

// a x b contracting a's last dim with b's dim `contract_b`, batched over the
// leading `batch` dims of both.
Value product(LoweringContext& ctx, const char* a_name, const char* b_name, int64_t batch,
              int64_t contract_b) {
  Builder& b = ctx.b;
  DType acc = acc_dtype(ctx.out().dtype);
  check_same_dtype(ctx, ctx.tensor(a_name), ctx.tensor(b_name));
  Value x = b.convert(ctx.tensor(a_name), acc), y = b.convert(ctx.tensor(b_name), acc);
  std::vector<int64_t> bd;
  for (int64_t i = 0; i < batch; ++i) bd.push_back(i);
  return b.dot_general(x, y, bd, bd, {x.rank() - 1}, {contract_b}, acc);
}

// beta * self + alpha * product; beta == 0 ignores self entirely (NaN/inf too).
Value add_product(LoweringContext& ctx, Value p) {
  Builder& b = ctx.b;
  Scalar alpha = ctx.scalar("alpha", Scalar::from_int(1)), beta = ctx.scalar("beta", Scalar::from_int(1));
  p = b.reshape(p, ctx.out().shape);
  if (alpha.to_double() != 1.0) p = b.binary("multiply", p, b.splat(alpha, p.type));
  if (beta.to_double() == 0.0) return p;
  check_same_dtype(ctx, ctx.tensor("self"), b.convert(p, ctx.out().dtype));
  Value s = b.broadcast_to(b.convert(ctx.tensor("self"), p.dtype()), p.shape());
  if (beta.to_double() != 1.0) s = b.binary("multiply", s, b.splat(beta, s.type));
  return b.binary("add", s, p);
}

// _grouped_mm(self, mat2, offs): the products of groups, as Mixture-of-Experts
// layers use them. offs (int32) holds each group's end, cumulative. 2D x 3D:
// rows of self in groups, group g times mat2[g]; 3D x 2D: columns of mat2 in
// groups, self[g] times them; 2D x 2D: the contraction dim in groups, one
// [M, N] product each; 3D x 3D: bmm. With no ragged dot here, every group's
// whole product is made and each row (column) selects its own group's (G
// times the flops of one; selects, not one-hot products, so another group's
// inf cannot make a nan). Positions past the last end are zero (CPU's kernel
// does not write them).
std::vector<Value> grouped_mm(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const Value& a_in = ctx.tensor("self");
  const Value& b_in = ctx.tensor("mat2");
  check_same_dtype(ctx, a_in, b_in);
  if (ctx.has("bias")) ctx.fail("_grouped_mm: bias is not supported");
  DType acc = acc_dtype(a_in.dtype()), od = ctx.out().dtype;
  Value x = b.convert(a_in, acc), y = b.convert(b_in, acc);
  if (x.rank() == 3 && y.rank() == 3) return {b.convert(b.dot_general(x, y, {0}, {0}, {2}, {1}, acc), od)};
  if (!ctx.has("offs")) ctx.fail("_grouped_mm: offs is needed for 2D operands");
  Value offs = b.convert(ctx.tensor("offs"), DType::I64);
  int64_t G = offs.shape()[0];
  // in_group[g, p]: position p (of n) is in group g, i.e. offs[g-1] <= p < offs[g].
  auto in_group = [&](int64_t n) {
    TensorType gp{DType::I64, {G, n}};
    Value pos = b.iota(gp, 1);
    Value ends = b.broadcast_in_dim(offs, {G, n}, {0});
    Value zero = b.zeros(TensorType{DType::I64, {1}});
    Value starts = b.concatenate({zero, b.slice(offs, {0}, {G - 1})}, 0);
    Value lo = b.broadcast_in_dim(starts, {G, n}, {0});
    return b.binary("and", b.compare(Cmp::GE, pos, lo), b.compare(Cmp::LT, pos, ends));
  };
  // Sums `full` over its group dim `gdim` where `mask` (broadcast along `dims`) holds.
  auto pick = [&](const Value& full, const Value& mask, const std::vector<int64_t>& dims, int64_t gdim) {
    Value m = b.broadcast_in_dim(mask, full.shape(), dims);
    Value kept = b.select(m, full, b.zeros(full.type));
    return b.reduce(kept, b.constant_int(0, acc), {gdim}, "stablehlo.add");
  };
  if (x.rank() == 2 && y.rank() == 3) {  // [M, K] x [G, K, N] -> [M, N]
    Value full = b.dot_general(x, y, {}, {}, {1}, {1}, acc);  // [M, G, N]
    return {b.convert(pick(full, in_group(x.shape()[0]), {1, 0}, 1), od)};
  }
  if (x.rank() == 3 && y.rank() == 2) {  // [G, M, K] x [K, N] -> [M, N]
    Value full = b.dot_general(x, y, {}, {}, {2}, {0}, acc);  // [G, M, N]
    return {b.convert(pick(full, in_group(y.shape()[1]), {0, 2}, 0), od)};
  }
  // [M, K] x [K, N] -> [G, M, N]: both operands masked to each group's K.
  int64_t M = x.shape()[0], K = x.shape()[1], N = y.shape()[1];
  Value mask = in_group(K);  // [G, K]
  Value xm = b.select(b.broadcast_in_dim(mask, {G, M, K}, {0, 2}), b.broadcast_in_dim(x, {G, M, K}, {1, 2}),
                      b.zeros(TensorType{acc, {G, M, K}}));
  Value ym = b.select(b.broadcast_in_dim(mask, {G, K, N}, {0, 1}), b.broadcast_in_dim(y, {G, K, N}, {1, 2}),
                      b.zeros(TensorType{acc, {G, K, N}}));
  return {b.convert(b.dot_general(xm, ym, {0}, {0}, {2}, {1}, acc), od)};
}

}  // namespace

TORCH_PJRT_LOWERING("_grouped_mm", grouped_mm);
TORCH_PJRT_LOWERING("mm", [](LoweringContext& c) { return std::vector<Value>{product(c, "self", "mat2", 0, 0)}; });
TORCH_PJRT_LOWERING("bmm", [](LoweringContext& c) { return std::vector<Value>{product(c, "self", "mat2", 1, 1)}; });
TORCH_PJRT_LOWERING("mv", [](LoweringContext& c) { return std::vector<Value>{product(c, "self", "vec", 0, 0)}; });
TORCH_PJRT_LOWERING("dot", [](LoweringContext& c) { return std::vector<Value>{product(c, "self", "tensor", 0, 0)}; });
// vdot(a, b): sum(conj(a) * b) (a itself for real dtypes).
TORCH_PJRT_LOWERING("vdot", [](LoweringContext& c) {
  Builder& b = c.b;
  Value x = c.tensor("self");
  if (x.rank() != 1 || c.tensor("other").rank() != 1)
    c.fail("1D tensors expected, but got " + std::to_string(x.rank()) + "D and " +
           std::to_string(c.tensor("other").rank()) + "D tensors");
  check_same_dtype(c, x, c.tensor("other"));
  if (is_complex(x.dtype())) {
    DType r = real_dtype(x.dtype());
    Value re = b.op("stablehlo.real", {x}, TensorType{r, x.shape()});
    Value im = b.op("stablehlo.imag", {x}, TensorType{r, x.shape()});
    x = b.op("stablehlo.complex", {re, b.unary("negate", im)}, x.type);
  }
  Value y = b.convert(c.tensor("other"), acc_dtype(c.out().dtype));
  x = b.convert(x, acc_dtype(c.out().dtype));
  return std::vector<Value>{b.dot_general(x, y, {}, {}, {0}, {0}, x.dtype())};
});
TORCH_PJRT_LOWERING("addmm", [](LoweringContext& c) {
  return std::vector<Value>{add_product(c, product(c, "mat1", "mat2", 0, 0))};
});
// _addmm_activation: addmm rounded to the result dtype, then relu or (exact)
// gelu in place, as CPU's kernel (nn.TransformerEncoderLayer's fast path).
TORCH_PJRT_LOWERING("_addmm_activation", [](LoweringContext& c) {
  Builder& b = c.b;
  DType out = c.out().dtype;
  Value r = b.convert(add_product(c, product(c, "mat1", "mat2", 0, 0)), out);
  if (!c.to_bool("use_gelu", false)) {
    Value zero = splat_like(b, 0, r);
    return std::vector<Value>{b.select(b.compare(Cmp::LT, r, zero), zero, r)};
  }
  return std::vector<Value>{b.convert(gelu_value(b, b.convert(r, acc_dtype(out)), false), out)};
});
TORCH_PJRT_LOWERING("baddbmm", [](LoweringContext& c) {
  return std::vector<Value>{add_product(c, product(c, "batch1", "batch2", 1, 1))};
});
TORCH_PJRT_LOWERING("addmv", [](LoweringContext& c) {
  return std::vector<Value>{add_product(c, product(c, "mat", "vec", 0, 0))};
});
TORCH_PJRT_LOWERING("addbmm", [](LoweringContext& c) {
  // Sum over the batch too: contract batch and inner dims.
  Builder& b = c.b;
  DType acc = acc_dtype(c.out().dtype);
  check_same_dtype(c, c.tensor("batch1"), c.tensor("batch2"));
  Value x = b.convert(c.tensor("batch1"), acc), y = b.convert(c.tensor("batch2"), acc);
  return std::vector<Value>{add_product(c, b.dot_general(x, y, {}, {}, {0, 2}, {0, 1}, acc))};
});

}  // namespace torch_pjrt::lowering::ops
