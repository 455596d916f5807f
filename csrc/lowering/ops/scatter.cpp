// Scatters: element-wise along one dim (scatter, scatter_add, scatter_reduce;
// also the backward of gather) and whole slices along one dim (index_add,
// index_copy, index_fill, index_reduce; index_add is the backward of
// index_select).
//
// Index ranges are checked in the program (ctx.check_indices, reported at the
// next host read with CPU's exception type): XLA's scatter itself drops
// out-of-range updates where PyTorch raises. Negative indices, which PyTorch
// rejects here (except index_fill, which wraps them), are out of range too.
#include <limits>

#include <optional>

#include "lowering/ops/common.h"

namespace torch_pjrt::lowering::ops {
namespace {

// ---------------------------------------------------------------------------
// Reductions shared by every scatter here.

enum class Reduce { Replace, Sum, Prod, Mean, Max, Min };

Reduce parse_reduce(const LoweringContext& ctx, const std::string& s) {
  if (s == "sum" || s == "add") return Reduce::Sum;
  if (s == "prod" || s == "multiply") return Reduce::Prod;
  if (s == "mean") return Reduce::Mean;
  if (s == "amax") return Reduce::Max;
  if (s == "amin") return Reduce::Min;
  ctx.fail("unknown reduce '" + s + "'");
}

std::string combine_op(Reduce r, DType dt) {
  bool logical = dt == DType::Bool;
  switch (r) {
    case Reduce::Replace: return "";
    case Reduce::Sum:
    case Reduce::Mean: return logical ? "stablehlo.or" : "stablehlo.add";
    case Reduce::Prod: return logical ? "stablehlo.and" : "stablehlo.multiply";
    case Reduce::Max: return logical ? "stablehlo.or" : "stablehlo.maximum";
    case Reduce::Min: return logical ? "stablehlo.and" : "stablehlo.minimum";
  }
  return "";
}

template <typename T>
Scalar int_limit(bool max) {
  return Scalar::from_int(max ? int64_t(std::numeric_limits<T>::max()) : int64_t(std::numeric_limits<T>::lowest()));
}

// The value a reduction starts from when self is left out (include_self=False).
Scalar identity(Reduce r, DType dt) {
  if (r == Reduce::Prod) return Scalar::from_int(1);
  if (r != Reduce::Max && r != Reduce::Min) return Scalar::from_int(0);
  bool max = r == Reduce::Min;  // amin starts from the largest value
  if (is_float(dt))
    return Scalar::from_float(max ? std::numeric_limits<double>::infinity()
                                  : -std::numeric_limits<double>::infinity());
  switch (dt) {
    case DType::Bool: return Scalar::from_int(max ? 1 : 0);
    case DType::U8: return int_limit<uint8_t>(max);
    case DType::I8: return int_limit<int8_t>(max);
    case DType::I16: return int_limit<int16_t>(max);
    case DType::I32: return int_limit<int32_t>(max);
    default: return int_limit<int64_t>(max);
  }
}

// Scatters `updates` into `base` at the op's positions with a combiner.
using ScatterFn = std::function<Value(const Value& base, const Value& updates, const std::string& combine)>;

// PyTorch's scatter_reduce/index_reduce: with include_self=False the positions
// that receive updates start from the reduction's identity; mean divides by the
// number of contributions (self counting as one when included; untouched
// positions keep self), flooring for integers.
// (`sum_dtype`: a mean's sum is rounded to it before the division, as CPU's
// float32 accumulation of half types does.)
Value reduce_into(Builder& b, const Value& self, const Value& updates, Reduce r, bool include_self,
                  const ScatterFn& scat, std::optional<DType> sum_dtype = std::nullopt) {
  DType dt = self.dtype();
  Value base = self;
  if (!include_self && r != Reduce::Replace) base = scat(self, b.splat(identity(r, dt), updates.type), "");
  Value res = scat(base, updates, combine_op(r, dt));
  if ((r == Reduce::Max || r == Reduce::Min) && is_float(dt)) {
    // XLA's scatter drops a NaN update under max/min; CPU's propagates it
    // (and self's, when included): positions that saw one become NaN.
    TensorType flags{DType::Bool, self.type.shape};
    Value seen = scat(include_self ? b.compare(Cmp::NE, self, self) : b.zeros(flags),
                      b.compare(Cmp::NE, updates, updates), "stablehlo.or");
    return b.select(seen, b.splat(Scalar::from_float(std::numeric_limits<double>::quiet_NaN()), self.type), res);
  }
  if (r != Reduce::Mean) return res;
  Value one = b.splat(Scalar::from_int(1), self.type);
  Value count = scat(include_self ? one : b.zeros(self.type), b.splat(Scalar::from_int(1), updates.type),
                     combine_op(Reduce::Sum, dt));
  count = b.select(b.compare(Cmp::EQ, count, b.zeros(self.type)), one, count);
  if (sum_dtype && *sum_dtype != dt) res = b.convert(b.convert(res, *sum_dtype), dt);
  return is_float(dt) ? b.binary("divide", res, count) : floor_divide(b, res, count);
}

// ---------------------------------------------------------------------------
// Element-wise along `dim`: self[p with p[dim] = index[p]] (op)= src[p] for
// every position p of index (src may be larger than index: only its leading
// part is used).

struct ElementScatter {
  // at least rank 1, in the output's math dtype: CPU's scatter kernels
  // accumulate float16/bfloat16 in float32 (scatter_add, scatter_reduce, the
  // deprecated scatter reduce=), rounding once at the end (done())
  Value self;
  Value coords;       // index.shape + [rank], i64
  Shape update_shape; // index.shape
  ScatterFn scat;
};

ElementScatter element_scatter(LoweringContext& ctx) {
  Builder& b = ctx.b;
  ElementScatter e;
  const Value& self = ctx.tensor("self");
  const Value& index = ctx.tensor("index");
  // PyTorch's Meta kernels leave this check to the device kernels (which,
  // like CPU's, accept any dtype for an empty index: gather's backward).
  if (index.dtype() != DType::I64 && index.dtype() != DType::I32 && index.type.numel() > 0)
    ctx.fail("Expected dtype int32/int64 for index");
  e.self = b.convert(self.rank() == 0 ? b.reshape(self, {1}) : self, math_dtype(ctx.out().dtype));
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), self.rank());
  Value idx = index.rank() == 0 || self.rank() == 0 ? b.reshape(index, {index.type.numel()}) : index;
  e.update_shape = idx.shape();
  // An empty index scatters nothing, whatever its rank (CPU accepts a 1-d
  // empty index into a 2-d self); the callers return self.
  if (idx.type.numel() == 0) return e;
  int64_t size = e.self.shape()[dim];
  ctx.check_indices(idx, 0, size,
                    "index out of bounds for dimension " + std::to_string(dim) + " with size " + std::to_string(size),
                    LoweringContext::CheckError::Runtime);
  Shape coord_shape = idx.shape();
  coord_shape.push_back(1);
  TensorType it{DType::I64, idx.shape()};
  std::vector<Value> coords;
  for (int64_t d = 0; d < e.self.rank(); ++d) {
    Value c = d == dim ? b.convert(idx, DType::I64) : b.iota(it, d);
    coords.push_back(b.reshape(c, coord_shape));
  }
  e.coords = b.concatenate(coords, idx.rank());
  Value coords_v = e.coords;
  e.scat = [&b, coords_v](const Value& base, const Value& upd, const std::string& combine) {
    return b.scatter_elements(base, coords_v, upd, combine);
  };
  return e;
}

// The element scatter's result `r` as the op's output.
Value done(LoweringContext& ctx, const Value& r) {
  return ctx.b.reshape(ctx.b.convert(r, ctx.out().dtype), ctx.out().shape);
}

// The leading index.shape part of src, in the math dtype.
Value src_updates(LoweringContext& ctx, const ElementScatter& e) {
  Builder& b = ctx.b;
  Value src = b.convert(ctx.tensor("src"), e.self.dtype());
  if (src.rank() == 0) src = b.reshape(src, {1});
  if (src.rank() != static_cast<int64_t>(e.update_shape.size()))
    ctx.fail("index and src should have the same number of dimensions");
  return b.slice(src, Shape(src.rank(), 0), e.update_shape);
}

// scatter.src / .value / .reduce / .value_reduce (reduce = "add" | "multiply").
std::vector<Value> scatter(LoweringContext& ctx) {
  ElementScatter e = element_scatter(ctx);
  if (e.self.type.numel() == 0 || numel(e.update_shape) == 0) return {done(ctx, e.self)};
  // (a value is rounded to the output dtype first, as CPU's scalar)
  Value upd = ctx.has("src") ? src_updates(ctx, e)
                             : ctx.b.convert(ctx.b.broadcast_to(ctx.operand("value", ctx.out().dtype), e.update_shape),
                                             e.self.dtype());
  Reduce r = ctx.has("reduce") ? parse_reduce(ctx, ctx.str("reduce")) : Reduce::Replace;
  return {done(ctx, e.scat(e.self, upd, combine_op(r, e.self.dtype())))};
}

std::vector<Value> scatter_add(LoweringContext& ctx) {
  ElementScatter e = element_scatter(ctx);
  if (e.self.type.numel() == 0 || numel(e.update_shape) == 0) return {done(ctx, e.self)};
  return {done(ctx, e.scat(e.self, src_updates(ctx, e), combine_op(Reduce::Sum, e.self.dtype())))};
}

// scatter_reduce.two(self, dim, index, src, reduce, include_self).
std::vector<Value> scatter_reduce(LoweringContext& ctx) {
  ElementScatter e = element_scatter(ctx);
  if (e.self.type.numel() == 0 || numel(e.update_shape) == 0) return {done(ctx, e.self)};
  return {done(ctx, reduce_into(ctx.b, e.self, src_updates(ctx, e), parse_reduce(ctx, ctx.str("reduce")),
                                ctx.to_bool("include_self", true), e.scat, ctx.out().dtype))};
}

// ---------------------------------------------------------------------------
// Whole slices along `dim`: self[.., index[i], ..] (op)= source[.., i, ..].

struct SliceScatter {
  Value self;          // at least rank 1 (PyTorch allows a 0-d self with a 1-element index)
  Shape update_shape;  // self's shape with `dim` of size index.numel()
  ScatterFn scat;
};

bool nothing_to_do(const SliceScatter& s) { return s.self.type.numel() == 0 || numel(s.update_shape) == 0; }

// `error`: CPU raises RuntimeError for index_add, IndexError for the others.
// `check_when_empty`: whether indices are checked when there is nothing to do
// (an empty self or source); CPU's index_reduce and a 1-d index_add check
// them, its index_copy, index_fill and index_add over more dims do not.
SliceScatter slice_scatter(LoweringContext& ctx, bool wrap_negative,
                           LoweringContext::CheckError error = LoweringContext::CheckError::Index,
                           bool check_when_empty = true) {
  Builder& b = ctx.b;
  SliceScatter s;
  const Value& self = ctx.tensor("self");
  const Value& index = ctx.tensor("index");
  // PyTorch's Meta kernels leave these checks to the device kernels.
  if (index.rank() > 1) ctx.fail("index is supposed to be a vector");
  if (!is_integral(index.dtype(), false)) ctx.fail("expected dtype int32 or int64 for index");
  int64_t dim = wrap_dim(ctx.to_int("dim", 0), self.rank());
  s.self = b.convert(self.rank() == 0 ? b.reshape(self, {1}) : self, ctx.out().dtype);
  int64_t n = index.type.numel();
  Value idx = b.convert(b.reshape(index, {n}), DType::I64);
  int64_t size = s.self.shape()[dim];
  s.update_shape = s.self.shape();
  s.update_shape[dim] = n;
  if (check_when_empty || !nothing_to_do(s))
    ctx.check_indices(idx, wrap_negative ? -size : 0, size,
                      "index out of bounds for dimension " + std::to_string(dim) + " with size " + std::to_string(size),
                      error);
  if (wrap_negative) {
    Value sz = b.splat(Scalar::from_int(size), idx.type);
    idx = b.select(b.compare(Cmp::LT, idx, b.zeros(idx.type)), b.binary("add", idx, sz), idx);
  }
  std::vector<int64_t> window;
  for (int64_t d = 0; d < s.self.rank(); ++d)
    if (d != dim) window.push_back(d);
  std::string dn = "scatter_dimension_numbers = #stablehlo.scatter<";
  if (!window.empty()) dn += "update_window_dims = " + i64_list(window) + ", ";
  dn += "inserted_window_dims = [" + std::to_string(dim) + "], scatter_dims_to_operand_dims = [" +
        std::to_string(dim) + "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  Value indices = b.reshape(idx, {n, 1});
  s.scat = [&b, indices, dn](const Value& base, const Value& upd, const std::string& combine) {
    return b.op_multi("stablehlo.scatter", {base, indices, upd}, {base.type}, dn,
                      b.scatter_region(base.dtype(), combine))[0];
  };
  return s;
}

Value source_updates(LoweringContext& ctx, const SliceScatter& s) {
  return ctx.b.reshape(ctx.b.convert(ctx.tensor("source"), s.self.dtype()), s.update_shape);
}


// index_add(self, dim, index, source, alpha).
std::vector<Value> index_add(LoweringContext& ctx) {
  Builder& b = ctx.b;
  // (CPU raises IndexError for a 1-d self, RuntimeError otherwise.)
  bool one_d = ctx.tensor("self").rank() <= 1;
  SliceScatter s = slice_scatter(ctx, false,
                                 one_d ? LoweringContext::CheckError::Index : LoweringContext::CheckError::Runtime,
                                 /*check_when_empty=*/one_d);
  if (nothing_to_do(s)) return {b.reshape(s.self, ctx.out().shape)};
  DType dt = s.self.dtype();
  Value src = source_updates(ctx, s);
  Value unscaled = src;
  if (ctx.has("alpha"))  // always applied: alpha may be a runtime input
    src = b.binary(dt == DType::Bool ? "and" : "multiply", src,
                   b.broadcast_to(ctx.operand("alpha", dt), src.shape()));
  Value r = s.scat(s.self, src, combine_op(Reduce::Sum, dt));
  // CPU adds along the first or last dim of a 2+-d self as scatter_add when
  // alpha is 1, the index int64 and source self's shape but along dim: half
  // types then accumulate in float32 (elsewhere in the half type, a slice at
  // a time, as the sum above).
  const Value& self = ctx.tensor("self");
  int64_t rank = self.rank(), dim = wrap_dim(ctx.to_int("dim", 0), std::max<int64_t>(rank, 1));
  DType m = math_dtype(dt);
  if (m != dt && rank > 1 && (dim == 0 || dim == rank - 1) && ctx.tensor("index").dtype() == DType::I64 &&
      ctx.tensor("source").shape() == s.update_shape) {
    const Arg* alpha = ctx.find("alpha");
    bool one = !alpha || alpha->dynamic || ctx.scalar("alpha").to_double() == 1.0;
    if (one) {
      Value wide = b.convert(s.scat(b.convert(s.self, m), b.convert(unscaled, m), combine_op(Reduce::Sum, m)), dt);
      if (alpha && alpha->dynamic)  // (one program for every alpha: chosen at run time)
        wide = b.select(b.broadcast_to(b.compare(Cmp::EQ, ctx.operand("alpha", m), b.splat(Scalar::from_float(1.0),
                                                                                          TensorType{m, {}})),
                                       r.shape()),
                        wide, r);
      r = wide;
    }
  }
  return {b.reshape(r, ctx.out().shape)};
}

std::vector<Value> index_copy(LoweringContext& ctx) {
  SliceScatter s = slice_scatter(ctx, false, LoweringContext::CheckError::Index, /*check_when_empty=*/false);
  if (nothing_to_do(s)) return {ctx.b.reshape(s.self, ctx.out().shape)};
  return {ctx.b.reshape(s.scat(s.self, source_updates(ctx, s), ""), ctx.out().shape)};
}

// index_fill(self, dim, index, value): value is a Scalar or a 0-d tensor.
std::vector<Value> index_fill(LoweringContext& ctx) {
  // (CPU's index_fill alone of these takes int64 indices only.)
  if (ctx.tensor("index").dtype() != DType::I64) ctx.index_error("index_fill_(): Expected dtype int64 for index.");
  check_scalar_fits(ctx, "value", ctx.out().dtype);
  SliceScatter s = slice_scatter(ctx, true, LoweringContext::CheckError::Index, /*check_when_empty=*/false);
  if (nothing_to_do(s)) return {ctx.b.reshape(s.self, ctx.out().shape)};
  Value v = ctx.b.broadcast_to(ctx.operand("value", s.self.dtype()), s.update_shape);
  return {ctx.b.reshape(s.scat(s.self, v, ""), ctx.out().shape)};
}

// index_reduce(self, dim, index, source, reduce, include_self): prod, mean, amax, amin.
std::vector<Value> index_reduce(LoweringContext& ctx) {
  SliceScatter s = slice_scatter(ctx, false);
  if (nothing_to_do(s)) return {ctx.b.reshape(s.self, ctx.out().shape)};
  Value r = reduce_into(ctx.b, s.self, source_updates(ctx, s), parse_reduce(ctx, ctx.str("reduce")),
                        ctx.to_bool("include_self", true), s.scat);
  return {ctx.b.reshape(r, ctx.out().shape)};
}

// histc(self, bins, min, max): how many elements fall in each of `bins` equal
// bins over [min, max], the last bin closed; elements outside (and NaN) are
// not counted. min == max: the data's extremes; still equal: -1/+1 around them,
// or (float and double, as CPU) one step of the type where that is wider.
// Floats as PyTorch's CPU kernel (HistogramKernel.cpp, linear interpolation
// without search): bin = int64((x - lo) * bins / (hi - lo)) in the input's
// type (half types round after each operation, as c10::Half's operators do).
// Integers, which CPU lacks (its probe's NotImplementedError is waived,
// cpu_check.cpp), as CUDA's kernel (SummaryOps.cu): the same formula in int64;
// transformers' Mixture-of-Experts layers count tokens per expert so.
std::vector<Value> histc(LoweringContext& ctx) {
  Builder& b = ctx.b;
  const TensorType& out = ctx.out();
  const Value& self = ctx.tensor("self");
  int64_t bins = out.numel(), n = self.type.numel();
  if (bins == 0 || n == 0) return {b.zeros(out)};
  DType dt = self.dtype();
  bool fl = is_float(dt);
  DType wt = fl ? math_dtype(dt) : DType::I64;
  auto round = [&](const Value& v) { return fl ? rounded_to(b, v, dt) : v; };
  Value x = b.convert(b.reshape(self, {n}), wt);
  double min = ctx.to_double("min", 0), max = ctx.to_double("max", 0);
  // The bounds as the kernels hold them: the input's type (CPU), int64 (CUDA).
  auto bound = [&](double v) {
    return fl ? round(b.convert(b.constant(v, DType::F64), wt)) : b.constant_int(int64_t(v), wt);
  };
  Value lo = bound(min), hi = bound(max);
  if (min == max) {
    double inf = std::numeric_limits<double>::infinity();
    auto extreme = [&](bool lowest) {
      if (fl) return b.constant(Scalar::from_float(lowest ? -inf : inf), wt);
      return b.constant_int(lowest ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max(), wt);
    };
    Value dlo = b.reshape(b.reduce(x, extreme(false), {0}, "stablehlo.minimum"), {});
    Value dhi = b.reshape(b.reduce(x, extreme(true), {0}, "stablehlo.maximum"), {});
    Value same = b.compare(Cmp::EQ, dlo, dhi);
    Value one = fl ? b.constant(1.0, wt) : b.constant_int(1, wt);
    Value wider_lo = b.binary("subtract", dlo, one), wider_hi = b.binary("add", dhi, one);
    if (fl && wt == dt) {  // float and double: at least one step (1e38 - 1 is 1e38, inf - 1 is inf), as CPU
      auto next = [&](const Value& v, double toward) {
        return b.op("chlo.next_after", {v, b.constant(Scalar::from_float(toward), wt)}, TensorType{wt, {}});
      };
      wider_lo = b.binary("minimum", round(wider_lo), next(dlo, -inf));
      wider_hi = b.binary("maximum", round(wider_hi), next(dhi, inf));
    }
    lo = round(b.select(same, wider_lo, dlo));
    hi = round(b.select(same, wider_hi, dhi));
    if (fl) {
      Value big = b.constant(Scalar::from_float(inf), wt);
      Value finite = b.binary("and", b.compare(Cmp::LT, b.unary("abs", lo), big),
                              b.compare(Cmp::LT, b.unary("abs", hi), big));
      ctx.check_all(finite, "torch.histc: range of the input is not finite", LoweringContext::CheckError::Runtime);
    }
  }
  TensorType vt{wt, {n}};
  Value lov = b.broadcast_to(lo, {n}), hiv = b.broadcast_to(hi, {n});
  Value inside = b.binary("and", b.compare(Cmp::GE, x, lov), b.compare(Cmp::LE, x, hiv));
  Value scaled = fl ? round(b.binary("multiply", round(b.binary("subtract", x, lov)), round(b.splat(Scalar::from_int(bins), vt))))
                    : b.binary("multiply", b.binary("subtract", x, lov), b.splat(Scalar::from_int(bins), vt));
  // (The width behind a barrier: XLA would divide by a constant one as a
  // multiplication by its reciprocal, which rounds differently.)
  Value width = round(b.binary("subtract", hi, lo));
  if (fl) width = b.op("stablehlo.optimization_barrier", {width}, width.type);
  Value q = round(b.binary("divide", scaled, b.broadcast_to(width, {n})));
  Value pos = b.convert(q, DType::I64);
  TensorType it{DType::I64, {n}};
  pos = b.binary("minimum", pos, b.splat(Scalar::from_int(bins - 1), it));
  // Elements outside go to index `bins`, which the scatter drops.
  pos = b.select(inside, pos, b.splat(Scalar::from_int(bins), it));
  Value ones = b.splat(Scalar::from_int(1), TensorType{out.dtype, {n}});
  return {b.scatter_elements(b.zeros(TensorType{out.dtype, {bins}}), b.reshape(pos, {n, 1}), ones,
                             out.dtype == DType::Bool ? "stablehlo.or" : "stablehlo.add")};
}

}  // namespace

TORCH_PJRT_LOWERING("scatter", scatter);
TORCH_PJRT_LOWERING("scatter_add", scatter_add);
TORCH_PJRT_LOWERING("scatter_reduce", scatter_reduce);
TORCH_PJRT_LOWERING("index_add", index_add);
TORCH_PJRT_LOWERING("index_copy", index_copy);
TORCH_PJRT_LOWERING("index_fill", index_fill);
TORCH_PJRT_LOWERING("index_reduce", index_reduce);
TORCH_PJRT_LOWERING("histc", histc);

}  // namespace torch_pjrt::lowering::ops
