// The one registry mapping an ATen op to its StableHLO lowering. Eager, fused
// eager and torch.compile all build programs through it.
//
// A lowering is registered once under the ATen base name ("add"), optionally
// with an overload ("max.dim"). It computes the functional result; in-place
// ("add_") and out= variants reuse it: the caller writes the result into the
// mutated tensor.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "lowering/builder.h"

namespace torch_pjrt::lowering {

// One argument of the op, in schema order.
// Thrown by LoweringContext::not_implemented; the frontends raise it as
// PyTorch's NotImplementedError.
struct NotImplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Arg {
  enum Kind : uint8_t { None, Tensor, TensorList, OptTensorList, Int, Float, Bool, IntList,
                        FloatList, String, ScalarType, Other } kind = None;
  std::string name;
  Value tensor;                          // Tensor
  bool wrapped_number = false;           // Tensor made from a Python scalar
  // Tensor: whether PyTorch's tensor is contiguous. A few results depend on
  // the layout on CPU too (_linalg_solve_ex factors A^T for a contiguous A,
  // and its backward relies on that); eager plans are keyed by strides.
  bool contiguous = true;
  std::vector<Value> tensors;            // TensorList
  std::vector<std::optional<Value>> opt_tensors;  // OptTensorList (index)
  Scalar scalar;                         // Int, Float, Bool
  std::vector<int64_t> ints;             // IntList
  std::vector<double> floats;            // FloatList
  std::string str;                       // String
  DType dtype = DType::F32;              // ScalarType
  // Int/Float: the value as a runtime program input (a 0-d f64), when the
  // executor passes it that way; `scalar` still holds this call's value.
  std::optional<Value> dynamic;
};

struct LoweringContext {
  Builder& b;
  std::string op;        // base name without "aten::" and without a trailing "_"
  std::string overload;  // "Tensor", "dim", "" ...
  std::vector<Arg> args;
  // Result types, from PyTorch's own shape and dtype inference.
  std::vector<TensorType> outputs;
  // A u64[2] random state input, present when the op asked for one.
  std::optional<Value> rng_state;
  // torch.get_default_dtype(): what integers and Python floats promote to
  // (int / int, int_tensor * 1.5). Eager plans are keyed by it.
  DType default_float = DType::F32;
  // New values for mutable arguments (Tensor(a!)) that the op writes but does
  // not return, e.g. native_batch_norm's running_mean; the executor writes them.
  struct Mutation {
    std::string name;
    int index;  // element of a Tensor[] argument, or -1
    Value value;
  };
  std::vector<Mutation> mutations;
  // Warnings CPU's kernel gives for this call that depend only on what the
  // program is keyed by (shapes, static arguments): eager gives them on
  // every call that uses the program, as CPU does.
  std::vector<std::string> warnings;
  void warn(std::string message) { warnings.push_back(std::move(message)); }
  // The same, given once per process (CPU's TORCH_WARN_ONCE).
  std::vector<std::string> warnings_once;
  void warn_once(std::string message) { warnings_once.push_back(std::move(message)); }
  // Set when a lowering read the value of a runtime scalar at build time
  // (scalar(), to_double()...): the program then holds for that value only.
  mutable bool scalar_value_read = false;

  void mutate(const std::string& name, const Value& v, int index = -1) {
    mutations.push_back(Mutation{name, index, v});
  }

  // Value checks that need the data (index ranges, integer division by
  // zero), computed inside the program when `checks_enabled` (TORCH_PJRT_CHECKS,
  // on by default): the frontends fold every `ok` into the device's check
  // word, and the next host read raises `error` with `message` (at once in
  // debug mode), as CPU raises at the op.
  enum class CheckError { Index, Runtime, LinAlg };  // IndexError, RuntimeError, torch.linalg.LinAlgError
  struct Check {
    Value ok;  // 0-d bool
    std::string message;
    CheckError error = CheckError::Index;
  };
  std::vector<Check> checks;
  bool checks_enabled = false;
  // Adds a check that every element of `idx` lies in [lo, hi).
  void check_indices(const Value& idx, int64_t lo, int64_t hi, const std::string& message,
                     CheckError error = CheckError::Index);
  // Adds a check that every element of `ok` (bool, any shape) is true.
  void check_all(const Value& ok, const std::string& message, CheckError error);

  const Arg* find(const std::string& name) const;
  const Arg& arg(const std::string& name) const;  // throws if absent
  bool has(const std::string& name) const;         // present and not None
  const Value& tensor(const std::string& name) const;
  Scalar scalar(const std::string& name, Scalar dflt = Scalar::from_int(0)) const;
  double to_double(const std::string& name, double dflt) const;
  int64_t to_int(const std::string& name, int64_t dflt) const;
  bool to_bool(const std::string& name, bool dflt) const;
  std::vector<int64_t> ints(const std::string& name) const;
  std::string str(const std::string& name, const std::string& dflt = "") const;
  // A tensor argument or a Scalar argument as a value of `dtype` with the
  // output's shape broadcast applied later by the caller.
  Value operand(const std::string& name, DType dtype);
  // The promotion class of an argument (for torch.result_type).
  PromotionOperand promotion(const std::string& name) const;
  const TensorType& out(size_t i = 0) const { return outputs.at(i); }
  [[noreturn]] void fail(const std::string& why) const;
  // What PyTorch's CPU kernel has no implementation of (e.g. a dtype): raised
  // as NotImplementedError, as CPU does, rather than RuntimeError.
  [[noreturn]] void not_implemented(const std::string& why) const;
  // CPU's dispatch error for a dtype its kernel lacks: "kernel" not implemented for 'Long'.
  [[noreturn]] void kernel_not_implemented(const std::string& kernel, DType t) const {
    not_implemented("\"" + kernel + "\" not implemented for '" + scalar_type_name(t) + "'");
  }
  // An index or indexing argument CPU rejects with IndexError (raised as such).
  [[noreturn]] void index_error(const std::string& why) const;
};

using LowerFn = std::function<std::vector<Value>(LoweringContext&)>;

struct LoweringInfo {
  LowerFn fn;
  bool needs_rng = false;
  std::string family;  // the ops/ file it lives in, e.g. "arithmetic"
};

void register_lowering(const std::string& name, LowerFn fn, bool needs_rng = false,
                       const std::string& source_file = "");
// Looks up "name.overload", then "name".
const LoweringInfo* find_lowering(const std::string& name, const std::string& overload);
std::vector<std::string> registered_lowerings();
// (name, family, needs_rng) of every lowering, sorted by name.
std::vector<std::tuple<std::string, std::string, bool>> lowering_table();

// Static registration from each lowering file.
struct LoweringRegistrar {
  LoweringRegistrar(const char* name, const char* file, LowerFn fn, bool needs_rng = false) {
    register_lowering(name, std::move(fn), needs_rng, file);
  }
};
#define TP_CONCAT_INNER(a, b) a##b
#define TP_CONCAT(a, b) TP_CONCAT_INNER(a, b)
#define TORCH_PJRT_LOWERING(name, ...) \
  static ::torch_pjrt::lowering::LoweringRegistrar TP_CONCAT(tp_lowering_, __COUNTER__)(name, __FILE__, __VA_ARGS__)

// The check word after `checks` (ok flags with their registered codes): the
// incoming word if already set, else the code of the first failing check.
Value fold_checks(Builder& b, Value word, const std::vector<std::pair<Value, int>>& checks);

// Helpers shared by many lowerings.
int64_t wrap_dim(int64_t dim, int64_t rank);
std::vector<int64_t> wrap_dims(const std::vector<int64_t>& dims, int64_t rank);  // empty -> all
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace torch_pjrt::lowering
