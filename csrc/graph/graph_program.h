// The torch.compile frontend's program builder: a whole FX graph (ATen ops,
// after AOTAutograd) becomes ONE StableHLO module, each node lowered by the
// same registry the eager executor uses. The Python side
// (torch_pjrt/_compile/lower_graph.py) walks the graph with concrete shapes
// and calls in here node by node; values are referred to by integer ids.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lowering/registry.h"
#include "lowering/strided_access.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {
struct Plan;
}

namespace torch_pjrt::graph {

// Where a program parameter comes from at run time.
struct ParamSource {
  // Offset: the storage offset of view input `input` (a 0-d s64, read at run
  // time: one program for every offset).
  enum Kind : char { Input, Rng, CpuPack, Storage, CheckWord, Offset } kind = Input;
  int input = -1;           // Input, Storage: index into the tensors passed to run()
  std::vector<int> inputs;  // CpuPack: CPU inputs of one dtype, concatenated
  lowering::DType dtype = lowering::DType::F32;  // CpuPack; Storage: the storage's element type
  // Storage: the input is a view; the program takes its whole storage (of
  // `storage_numel` elements) and reads the view itself, so no copy runs first.
  int64_t storage_numel = 0;
  lowering::StridedView view;
};

// One result of the compiled graph.
struct OutputSpec {
  lowering::DType dtype = lowering::DType::F32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // a dense layout PyTorch expects (the program writes that order)
  bool on_cpu = false;  // PyTorch placed this value on the CPU (e.g. an optimizer's step count)
  int program_output = -1;
};

class GraphProgram {
 public:
  GraphProgram();  // (reads torch's float32 matmul precision: the graph's dots take it)
  // A tensor graph input (tpu or CPU tensor of `type`), parameter of the program.
  int input(int input_index, const lowering::TensorType& type);
  // A tpu input that is a view (strided, offset, or part of a larger
  // storage): the program reads it from the storage, for inputs with the
  // same view geometry (run() returns nullopt for others).
  int input_view(int input_index, const at::Tensor& t);
  // CPU tensor inputs (scalars such as step counts): one parameter per dtype
  // holding them all, so a run makes one transfer per dtype, not one each.
  std::vector<int> cpu_inputs(const std::vector<std::pair<int, lowering::TensorType>>& inputs);
  // Runs the lowering of `name.overload`; `args` hold value ids in their
  // tensor fields' `id` (resolved by resolve_args). Returns one id per result
  // type (nullopt for undefined results, whose type is absent), followed by
  // the ids of the lowering's mutations, as (arg name, list index, id).
  struct CallResult {
    std::vector<std::optional<int>> results;
    std::vector<std::tuple<std::string, int, int>> mutations;
    // The lowering read the value of a runtime scalar argument (Arg::dynamic):
    // the program would hold for this value only.
    bool read_dynamic = false;
  };
  // A random op draws a new key parameter, unless `rng` (a value id: an s64[2]
  // key, rng_key()) is given.
  CallResult call(const std::string& name, const std::string& overload, std::vector<lowering::Arg> args,
                  const std::vector<std::optional<lowering::TensorType>>& outputs,
                  std::optional<int> rng = std::nullopt);
  // A new key parameter (s64[2]) drawn from the device generator per run.
  int rng_key();
  // A view (any aliasing ATen op) of value `base`, from the metadata PyTorch
  // computed for both: the base's layout is rebuilt and the view read from it.
  // `shift` (a value id: 0-d s64) moves the view by that many elements at run
  // time (x[n] for a Python int n the program takes as an input).
  int view(int base, const lowering::StridedView& base_view, const lowering::StridedView& out_view,
           lowering::DType out_dtype, std::optional<int> shift = std::nullopt);
  // diagonal_scatter / as_strided_scatter (and slice/select_scatter at a
  // runtime `shift`): a copy of `base` (laid out as `base_view`, dense) with
  // value `src` written where `out_view` reads.
  int view_scatter(int base, const lowering::StridedView& base_view, const lowering::StridedView& out_view, int src,
                   std::optional<int> shift = std::nullopt);
  // Control flow (torch.cond, while_loop, scan -> stablehlo.if / while).
  // open_region starts a region whose block arguments have `types` (their
  // ids returned; values made before it may be used inside); close_region
  // ends the innermost one yielding `results` and returns its handle. The
  // value checks made inside a region leave it as a failure code it yields
  // (`yields_code`; a loop's regions also carry it, `loop`), which the op's
  // result adds to the check word. A loop's condition yields no code: a
  // check there raises.
  std::vector<int> open_region(const std::vector<lowering::TensorType>& types, bool loop);
  int close_region(const std::vector<int>& results, bool yields_code);
  std::vector<int> if_op(int pred, int then_region, int else_region);
  std::vector<int> while_op(const std::vector<int>& init, int cond_region, int body_region);
  const lowering::Value& value(int id) const { return values_.at(id); }
  lowering::Builder& builder() { return b_; }
  int add(const lowering::Value& v);

  // Finishes the module with `outputs` as results, flattened as storages hold
  // them, each in the memory order of its `strides` when those are dense.
  // With value checks, the updated check word is one more, last, output.
  std::string finish(const std::vector<int>& outputs, const std::vector<std::vector<int64_t>>& strides);
  const std::vector<ParamSource>& params() const { return params_; }
  int check_output() const { return check_output_; }
  const std::vector<lowering::TensorType>& output_types() const { return output_types_; }
  const std::vector<lowering::TensorType>& param_types() const { return b_.param_types(); }

 private:
  lowering::Builder b_;
  std::vector<lowering::Value> values_;
  // A tpu input read from its storage (input_view): the storage, flat in the
  // input's dtype, and the input's runtime storage offset. Views of it read
  // the storage itself (as_strided may reach outside the input's elements).
  struct StorageRead {
    lowering::Value flat, offset;
  };
  std::map<int, StorageRead> storage_reads_;  // by value id
  std::vector<ParamSource> params_;
  // A check: `ok` (0-d bool) or failing with registered `code`; or, after a
  // control-flow op, the code its regions computed (`failed`, 0: none).
  struct Check {
    lowering::Value ok;
    int code = 0;
    std::optional<lowering::Value> failed;
  };
  std::vector<Check> checks_;
  // The first failing check of checks_[from..] as a code, or `word` if nonzero.
  lowering::Value fold_checks(const lowering::Value& word, size_t from);
  struct Region {
    std::string text;
    std::vector<lowering::TensorType> yields;
    bool code = false;  // its last block argument (loops) and yield: a check code
  };
  struct OpenRegion {
    size_t checks_from;
    bool loop, code;
    std::optional<lowering::Value> code_arg;
  };
  std::vector<Region> regions_;
  std::vector<OpenRegion> open_;
  std::vector<int> control_results(const std::vector<lowering::Value>& results, bool code);
  int check_output_ = -1;
  std::vector<lowering::TensorType> output_types_;
};

// A compiled whole-graph program and how to feed it. Its executable lives in
// the process's ProgramCache (LRU-bounded, shared with eager programs) under
// `cache_key`; once evicted, the frontend compiles the graph again.
struct CompiledGraph {
  std::string cache_key;
  std::vector<ParamSource> params;
  int check_output = -1;  // program output holding the updated check word
  std::vector<OutputSpec> outputs;            // returned to the caller
  std::vector<std::pair<int, int>> mutations;  // (input index, program output): written back
  int device = 0;  // where it runs when no input is a tpu tensor (factories only)
  // Non-empty: the graph holds collectives; replica r runs on the device of
  // global id replica_ids[r], and each rank launches its own part.
  std::vector<int64_t> replica_ids;
  // The program as one step of a fused eager trace (its text kept for that).
  std::shared_ptr<eager::Plan> fused_plan;
};

// Keeps what fused eager needs to record `g` (built from `prog`, `text`).
void prepare_fused(CompiledGraph& g, const GraphProgram& prog, const std::string& text, const std::string& name);

// Puts `exe` in the ProgramCache under a new key for `g`.
void make_resident(CompiledGraph& g, runtime::ExecutablePtr exe);
bool resident(const CompiledGraph& g);
// Runs `g` on `inputs` (tpu tensors, or CPU tensors for CPU graph inputs):
// asynchronous unless an output or a mutated input lives on the CPU. nullopt
// (nothing run) when a view input's geometry differs from the compiled one,
// or when the executable was evicted (resident() is then false).
std::optional<std::vector<at::Tensor>> run(const CompiledGraph& g, const std::vector<at::Tensor>& inputs);
// Whether `t` is its whole storage, dense and row-major (passed as is).
bool covers_storage(const at::Tensor& t);

}  // namespace torch_pjrt::graph
