// The structures of a fused eager trace and its cache entry, shared by the
// recorder (fused.cpp) and step capture (step_capture.cpp), which replays a
// recorded trace without running the Python that recorded it.
#pragma once

#include <c10/core/Storage.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "device/storage.h"
#include "eager/plan.h"
#include "eager/python_line.h"
#include "lowering/types.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager::fused_detail {

// A cut planned in the part of a trace after an earlier cut: after `ops` ops
// of that part, whose hash there (`hash`) is taken at its first sighting and
// checked at the next ones.
struct PlannedCut {
  size_t ops = 0;
  uint64_t hash = 0;
  bool known = false;
};

struct TraceOp {
  std::shared_ptr<Plan> plan;
  int32_t first_code;   // into Trace::codes (one per Storage parameter)
  int32_t first_value;  // value id of the plan's program output 0
  int32_t fpack_at, ipack_at;
  PythonLine where;  // the Python line that called it
};

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

struct Trace {
  int device = -1;
  std::vector<TraceOp> ops;
  std::vector<int32_t> codes;  // >= 0: a value id; < 0: ~(external index)
  std::vector<runtime::BufferPtr> externals;
  std::vector<const lowering::TensorType*> external_types;  // as the first op read it (plan-owned)
  // (Open addressing: no allocation per external, and reset keeps its table.)
  ska::flat_hash_map<const runtime::Buffer*, int32_t> external_index;
  std::vector<double> fpack;   // runtime scalars of every op, in order
  std::vector<int64_t> ipack;  // storage offsets and random keys, in order
  std::vector<int32_t> rng_at;  // where in ipack each random key (2 values) is
  // The packs already on the device (a replayed step's, which do not change);
  // when set, the vectors above may stay empty.
  runtime::BufferPtr fpack_buffer, ipack_buffer;
  int32_t next_value = 0;
  bool checks = false;
  std::vector<device::StorageBuffer*> written;  // storages the trace owes (null: died)
  std::vector<const lowering::TensorType*> written_types;  // the type of each one's latest value
  // (external index, written slot): a storage whose old buffer, an input
  // here, the trace overwrites; it may be donated to the storage's new value.
  std::vector<std::pair<int32_t, int32_t>> overwritten;
  // The structure (what the fused program depends on), built as ops are
  // recorded: plan serials and input codes, then the values that leave.
  std::vector<int64_t> structure;
  static constexpr uint64_t kHashSeed = 1469598103934665603ull;  // FNV-1a's offset basis
  uint64_t hash = kHashSeed;
  // The hash before each op (where a learned pipeline cut may fall), and
  // whether this trace began at such a cut (flushed at the next host read,
  // never learned from).
  std::vector<uint64_t> op_hash;
  bool after_cut = false;
  // A part after a learned cut that is itself to be cut: the planned cuts
  // of the rest of its chain (fused.cpp, learn_cut), from `planned_at` on.
  std::shared_ptr<std::vector<PlannedCut>> planned;
  size_t planned_at = 0;
  void mix(int64_t v) {
    structure.push_back(v);
    hash = (hash ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  }
  // Filled only while a step is captured: the storage each external and
  // each written slot belongs to (weakly held: a capture must not keep
  // values alive that would otherwise die), the externals' storage serials,
  // and whether a random op named its own generator.
  std::vector<WeakStorage> external_storage, written_storage;
  std::vector<uint64_t> external_serial;
  bool explicit_generator = false;

  // Empties the trace for the next one; the vectors keep their capacity, so
  // a trace like the last (a training or decode step's) records without
  // growing them op by op. (A member added above is reset here too.)
  void reset() {
    device = -1;
    ops.clear();
    codes.clear();
    externals.clear();
    external_types.clear();
    external_index.clear();
    fpack.clear();
    ipack.clear();
    rng_at.clear();
    fpack_buffer.reset();
    ipack_buffer.reset();
    next_value = 0;
    checks = false;
    written.clear();
    written_types.clear();
    overwritten.clear();
    structure.clear();
    hash = kHashSeed;
    op_hash.clear();
    after_cut = false;
    planned.reset();
    planned_at = 0;
    external_storage.clear();
    written_storage.clear();
    external_serial.clear();
    explicit_generator = false;
  }
};

struct Entry {
  std::vector<int64_t> structure;
  runtime::ExecutablePtr exe;
  // Its fused program while it compiles on a compile thread; becomes `exe`
  // at the first flush that finds it done (`failed` if it did not compile).
  runtime::ExecutablePtr compiling;
  std::vector<std::pair<int32_t, int32_t>> aliases;  // (external, output) donated when safe
  int seen = 0;
  bool failed = false;  // the fused program did not compile: op by op
  bool cut_learned = false;  // a pipelined cut was learned from it
  // When to compile (fused.cpp, compile_due): the flush count at its last
  // sighting, and the host time its op-by-op runs have taken.
  int64_t last_flush = -1;
  double op_by_op_seconds = 0;
  // The packs last uploaded for this program (run_fused): a trace recorded
  // again with the same runtime scalars and offsets (a decode step's) reuses
  // them instead of a host-to-device copy per flush. Never donated.
  mutable std::vector<double> last_fpack;
  mutable std::vector<int64_t> last_ipack;
  mutable runtime::BufferPtr last_fpack_buffer, last_ipack_buffer;
};

// Runs `t` as the entry's fused program; the first n_outputs results are the
// values that leave. The caller holds the device lock. `on_launch_thread`:
// the plugin's execute call is made on the launch thread (Runtime::launch)
// and the outputs come back pending.
std::vector<runtime::BufferPtr> run_fused(const Trace& t, const Entry& e, size_t n_outputs,
                                          bool on_launch_thread = false);

// Step capture (step_capture.cpp): whether a capture is recording, and the
// hook a flush calls while one is, with the values that leave (value id,
// storage) and the trace's cache entry.
bool capturing();
void capture_flushed(const Trace& t, const std::vector<std::pair<int32_t, device::StorageBuffer*>>& live,
                     const std::shared_ptr<Entry>& e, const char* why);

}  // namespace torch_pjrt::eager::fused_detail
