// A small typed builder that emits a StableHLO module as MLIR text in the
// generic operation syntax, which every StableHLO version parses the same way.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lowering/types.h"

namespace torch_pjrt::lowering {

enum class Cmp { EQ, NE, LT, LE, GT, GE };

// XLA's operand precision of a float32 dot or convolution: DEFAULT is one
// bfloat16 pass on TPU (TF32 on GPU), HIGH three, HIGHEST float32. PyTorch's
// torch.get_float32_matmul_precision() "highest" (its default), "high" and
// "medium" map to them (the frontends set it; XLA:CPU computes float32 always).
enum class Precision : uint8_t { Default, High, Highest };

class Builder {
 public:
  Value param(const TensorType& type);

  // Constants. Float values are emitted bit-exactly; f16/bf16 via f32.
  Value constant(const Scalar& v, DType dtype);
  Value constant(double v, DType dtype) { return constant(Scalar::from_float(v), dtype); }
  Value constant_int(int64_t v, DType dtype) { return constant(Scalar::from_int(v), dtype); }
  Value splat(const Scalar& v, const TensorType& type);
  Value zeros(const TensorType& type) { return splat(Scalar::from_int(0), type); }

  // Generic operation: `name` like "stablehlo.add", attrs inside { }.
  Value op(const std::string& name, const std::vector<Value>& operands, const TensorType& result,
           const std::string& attrs = "");
  std::vector<Value> op_multi(const std::string& name, const std::vector<Value>& operands,
                              const std::vector<TensorType>& results, const std::string& attrs,
                              const std::string& region = "");

  Value unary(const std::string& name, const Value& x);
  Value binary(const std::string& name, const Value& a, const Value& b);  // same shapes/dtypes
  Value compare(Cmp dir, const Value& a, const Value& b);
  Value select(const Value& pred, const Value& on_true, const Value& on_false);
  Value convert(const Value& x, DType to);
  Value convert_to_float8(const Value& x, DType to);  // (convert's float8 case)
  Value bitcast_convert(const Value& x, const TensorType& to);
  Value reshape(const Value& x, const Shape& shape);
  Value transpose(const Value& x, const std::vector<int64_t>& perm);
  Value broadcast_in_dim(const Value& x, const Shape& shape, const std::vector<int64_t>& dims);
  // NumPy-style broadcast of `x` to `shape` (trailing dims aligned).
  Value broadcast_to(const Value& x, const Shape& shape);
  Value slice(const Value& x, const Shape& start, const Shape& limit, const Shape& strides = {});
  Value pad(const Value& x, const Value& pad_value, const Shape& low, const Shape& high,
            const Shape& interior = {});
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  Value reverse(const Value& x, const std::vector<int64_t>& dims);
  Value iota(const TensorType& type, int64_t dim);
  Value dynamic_update_slice(const Value& x, const Value& update, const Shape& start);
  // The same with runtime start indices (0-d i64 values).
  Value dynamic_update_slice_at(const Value& x, const Value& update, const std::vector<Value>& start);
  Value dynamic_slice(const Value& x, const std::vector<Value>& start, const Shape& sizes);
  // Reduce `x` over `dims` with a binary body op ("stablehlo.add", "stablehlo.maximum", ...).
  Value reduce(const Value& x, const Value& init, const std::vector<int64_t>& dims,
               const std::string& body_op);
  Value dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                    const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                    const std::vector<int64_t>& contract_b, DType result_dtype);
  // gather/scatter of single elements of `x` along every dim, indices of shape
  // [..., rank(x)] (index_vector_dim last).
  Value gather_elements(const Value& x, const Value& indices);
  Value scatter_elements(const Value& x, const Value& indices, const Value& updates,
                         const std::string& combine_op = "");

  // stablehlo.while over the loop-carried values `init`. `cond` returns a
  // 0-d bool, `body` the next values (same types); both get the carried
  // values as block arguments and may use values made before the loop. For
  // sequential algorithms (LU's column steps) in a program of fixed size.
  using LoopFn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;
  std::vector<Value> while_loop(const std::vector<Value>& init, const LoopFn& cond, const LoopFn& body);

  // A region whose block arguments have `types`; `fn` emits its body and
  // returns what it yields (while's cond and body, a variadic reduction's body).
  std::string region(const std::vector<TensorType>& types, const LoopFn& fn);
  // The same in two calls, for a caller that emits the body in between (the
  // graph frontend walking a control-flow subgraph): open_region returns the
  // block arguments; close_region the region's text, yielding `results`.
  // Regions nest; close_region closes the innermost open one.
  std::vector<Value> open_region(const std::vector<TensorType>& types);
  std::string close_region(const std::vector<Value>& results);
  // A region `{ ^bb0(%a: T, %b: T): %r = body(%a, %b); return %r }` for reduce/scatter.
  std::string binary_region(DType dtype, const std::string& body_op);
  // A scatter's update region: `combine_op` ("stablehlo.add", ...) or, when
  // empty, replace with the update.
  std::string scatter_region(DType dtype, const std::string& combine_op);

  // Wraps everything emitted so far as `func.func @main` returning `results`
  // (after the functions added with add_function).
  std::string finish(const std::vector<Value>& results) const;
  // Adds a private function (its text) to the module finish() makes; calls
  // to it are `func.call` ops (fused eager composes op programs this way).
  void add_function(const std::string& text) { functions_ += text; }
  // A program run replicated on `n` devices (collectives): the module's
  // mhlo.num_replicas. 0: an ordinary one-device program.
  void set_replicas(int n) { replicas_ = n; }
  int replicas() const { return replicas_; }
  const std::vector<TensorType>& param_types() const { return params_; }
  // Parameter `param` may share its buffer with result `result` (the
  // tf.aliasing_output attribute: a donated input becomes that output).
  void alias(size_t param, size_t result) { aliases_.emplace_back(param, result); }

  std::string fresh();

  void set_f32_precision(Precision p) { f32_precision_ = p; }
  Precision f32_precision() const { return f32_precision_; }
  // Within an op whose inputs are bfloat16 (float16), its float32
  // intermediates (attention's probabilities) need no more passes than the
  // inputs' own precision: one (three). While alive, caps the setting so.
  class PrecisionCap {
   public:
    PrecisionCap(Builder& b, DType inputs) : b_(b), saved_(b.f32_precision_) {
      if (inputs == DType::BF16) b.f32_precision_ = Precision::Default;
      if (inputs == DType::F16) b.f32_precision_ = std::min(saved_, Precision::High);
    }
    ~PrecisionCap() { b_.f32_precision_ = saved_; }
    PrecisionCap(const PrecisionCap&) = delete;
    PrecisionCap& operator=(const PrecisionCap&) = delete;

   private:
    Builder& b_;
    Precision saved_;
  };
  // Whether a float32 dot or convolution took the setting (its programs then
  // depend on it: eager plans are keyed by it from then on).
  bool used_f32_precision() const { return used_f32_precision_; }
  // ", precision_config = [...]" for a dot or convolution of a and b, or "".
  // Operands widened from bfloat16 (or float8, int8, bool) are exact in one
  // bfloat16 pass, from float16 in three: only real float32 values take the
  // setting, so a bfloat16 model's products stay single-pass on TPU.
  std::string precision_attr(const Value& a, const Value& b);

 private:
  Precision f32_precision_ = Precision::Highest;
  bool used_f32_precision_ = false;
  std::unordered_map<std::string, DType> widened_;  // value id -> the narrower type it came from
  // Float constants (rank 0) and their broadcasts: value id -> the constant.
  std::unordered_map<std::string, Value> float_constant_;
  Value convert_value(const Value& x, DType to);
  int next_ = 0;
  int replicas_ = 0;
  std::vector<TensorType> params_;
  std::vector<std::pair<size_t, size_t>> aliases_;
  std::string body_;
  std::string functions_;
  struct OpenRegion {
    std::string outer_body, signature;
  };
  std::vector<OpenRegion> open_;
};

std::string i64_array(const std::vector<int64_t>& v);  // "array<i64: 1, 2>"
std::string i64_list(const std::vector<int64_t>& v);   // "[1, 2]"

}  // namespace torch_pjrt::lowering
