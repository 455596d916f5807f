// Helpers shared by the lowering files in this folder.
#pragma once

#include <functional>
#include <utility>

#include "lowering/registry.h"

namespace torch_pjrt::lowering::ops {

// The dtype PyTorch computes a binary op in: torch.result_type(self, other).
DType compute_dtype(const LoweringContext& ctx, const std::string& a, const std::string& b);

// `name` (tensor or scalar) converted to `dtype` and broadcast to `shape`.
Value operand_as(LoweringContext& ctx, const std::string& name, DType dtype, const Shape& shape);

// `name` in the math dtype of result dtype `out` (float32 for half types),
// broadcast to `shape`, cast to `out` first as CPU's TensorIterator casts
// its inputs: a Python scalar or a float32 0-dim tensor beside a half tensor
// is rounded to the half type (fp16 xlogy(x, 1e5) is inf, atan2(x, 0.3) in
// bfloat16 uses 0.30078).
Value operand_rounded(LoweringContext& ctx, const std::string& name, DType out, const Shape& shape);

// Scalar constant broadcast to the type of `like`.
Value splat_like(Builder& b, double v, const Value& like);

// Half types are computed in float32 and rounded once, as PyTorch's CPU kernels do.
DType math_dtype(DType out);
// `v` rounded to `t`'s precision and kept in its own type (a float32 value
// rounded as a c10::Half or BFloat16 operation's result is); `v` itself when
// it already has type `t`.
Value rounded_to(Builder& b, const Value& v, DType t);
// Raises CPU's "mat1 and mat2 shapes cannot be multiplied" unless a and b are
// matrices whose inner dims (a's dim 1, b's dim `b_inner`) agree.
void check_matrix_product(const LoweringContext& ctx, const Shape& a, const Shape& b, int64_t b_inner);
// `fn` applied to ctx.tensor("self") in the output's math dtype, rounded to the output dtype.
std::vector<Value> float_unary(LoweringContext& ctx,
                               const std::function<Value(Builder&, const Value&)>& fn);
Value erf(Builder& b, const Value& x);
Value erfc(Builder& b, const Value& x);  // (float32 or float64)
// hypot(x, y) of float32/float64 x and y, and |z| of a complex tensor,
// rounded as CPU's hypot (hypot.cpp).
Value hypot_as_cpu(Builder& b, const Value& x, const Value& y);
Value complex_abs(Builder& b, const Value& z);
// The sign bit of a float (true for -0.0 and negative NaNs); x < 0 for integers.
Value signbit(Builder& b, const Value& x);
// sinh/cosh of a real float within about 1.5 ulp (unary_special.cpp).
Value real_sinh_or_cosh(Builder& b, const Value& x, bool cosh);

// Complex parts and complex functions as PyTorch's CPU computes them (complex_math.cpp).
Value real_part(Builder& b, const Value& z);
Value imag_part(Builder& b, const Value& z);
Value make_complex(Builder& b, const Value& re, const Value& im);
Value complex_sin_or_cos(Builder& b, const Value& z, bool cos);
Value complex_sinh_or_cosh(Builder& b, const Value& z, bool cosh);
Value complex_exp(Builder& b, const Value& z);
Value complex_exp2(Builder& b, const Value& z);
Value complex_pow(Builder& b, const Value& x, const Value& y);
Value complex_sqrt(Builder& b, const Value& z);
Value complex_log_base(Builder& b, const Value& z, double ln_base);  // log2, log10
Value complex_logaddexp(Builder& b, const Value& x, const Value& y);
// chlo.asin/acos/... of z with the branch cut's side from z's signed zeros;
// `odd`: f(-z) = -f(z) (asin, asinh, atan, atanh).
Value complex_inverse_trig(Builder& b, const Value& z, const std::string& chlo, bool odd);
// gelu of `x` in x's dtype: exact (erf) or the tanh approximation.
Value gelu_value(Builder& b, const Value& x, bool tanh_approximation);
// Numerically stable softmax (or log_softmax) of `x` along `dim`, in x's dtype:
// the max along dim subtracted before exponentiating (-inf rows give NaN).
Value softmax_along(Builder& b, const Value& x, int64_t dim, bool log = false);

// The values an integer dtype holds, as doubles (lowest, highest).
std::pair<double, double> integer_range(DType t);
// c10::checked_convert's check of a Scalar argument converted to an integer
// dtype `t` (fill_, full, masked_fill, index_fill, where, clamp, add's alpha): CPU raises "value cannot
// be converted to type int8_t without overflow" for int8 fill_(300), where
// compiled graphs (no CPU probe) wrapped it to 44. (Not for float16's 1e5:
// PyTorch's own where(c, half, 1e5) reaches a fill with it, which CPU allows.)
// `floats`: float types' ranges too (clamp's bounds: "c10::Half"). A Python
// number wrapped into a Tensor argument (compiled graphs) is checked as well.
void check_scalar_fits(const LoweringContext& ctx, const std::string& name, DType t, bool floats = false);
// A float dtype's largest finite value (float64's for the others).
double largest_finite(DType t);

// Floor division and remainder with Python semantics, for int or float.
Value floor_divide(Builder& b, const Value& a, const Value& d);
Value python_remainder(Builder& b, const Value& a, const Value& d);

// (values, int64 indices) of x sorted stably along dim (NaN greatest), sort.cpp.
std::pair<Value, Value> sort_with_indices(Builder& b, const Value& x, int64_t dim, bool descending);

// Inclusive scan of x along dim by an associative `combine` (scan.cpp): the
// log-step scan cumsum/cumprod use; `identity` pads the front.
using Combine = std::function<Value(Builder&, const Value&, const Value&)>;
Value inclusive_scan(Builder& b, const Value& x, int64_t dim, double identity, const Combine& combine);
// Inclusive running sum along dim (offsets, compaction places).
Value prefix_sum(Builder& b, const Value& x, int64_t dim);

// searchsorted's search (searchsorted.cpp): per value of v (shape S), its slot in
// the sorted rows of seq ([M], or [B..., M] with v of shape [B..., K]); `sorter`
// reorders the rows (argsort's indices) or is null; `right`: the first element > v.
Value binary_search(Builder& b, const Value& seq, const Value& v, const Value* sorter, bool right);

}  // namespace torch_pjrt::lowering::ops
