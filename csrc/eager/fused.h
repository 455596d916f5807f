// Fused eager (TORCH_PJRT_EAGER=fused, torch_pjrt.fused()): ops are recorded
// instead of launched; the recorded trace runs as one program when something
// needs its values. See docs/ARCHITECTURE.md, "Fused eager".
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <map>
#include <memory>
#include <string>

#include "device/storage.h"
#include "lowering/types.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::eager {

struct Plan;
struct OpInstance;

// Whether ops are recorded now (the environment's default, or a fused()
// region open anywhere in the process; never in debug mode).
// Reads the fused settings read lazily (TORCH_PJRT_FUSED_COMPILE) now, at the import.
void read_fused_settings();
bool fused_active();
// fused() regions: enter adds one, leave removes one and runs the trace when
// the last region closes.
void fused_enter();
void fused_leave();

// Records one op call (its plan found or built) instead of running it.
// False when the op cannot be recorded (a host scalar return): the caller
// runs it strictly.
bool fused_record(const std::shared_ptr<Plan>& plan, OpInstance& inst, c10::ArrayRef<c10::IValue> args,
                  torch::jit::Stack* stack, size_t nargs);

// A whole program (a compiled graph's) as one step of the trace. `inputs`:
// per Storage parameter of the plan, in order, a storage (its buffer or the
// value the trace owes it) or, with no storage, a buffer made for this call
// (CPU inputs uploaded); `ivalues`: the Offsets and Rng parameters' values in
// order; `writes`: storages that receive a program output (mutated inputs,
// fresh results). The caller holds the device lock.
struct ProgramInput {
  c10::Storage storage;  // none: `buffer` is the value
  std::shared_ptr<runtime::Buffer> buffer;
  lowering::DType dtype = lowering::DType::F32;
};
void fused_record_program(const std::shared_ptr<Plan>& plan, int device, const std::vector<ProgramInput>& inputs,
                          const std::vector<int64_t>& ivalues,
                          const std::vector<std::pair<c10::Storage, int>>& writes);

// Runs the pending trace now (nothing when there is none); `reason` is
// counted in metrics (fused_flushes_by_reason).
void fused_flush(const char* reason);
// A host read: the part of a trace after a pipelined cut runs now (its
// values are not waited for).
void fused_at_host_read();
// Runs the pending trace because its value `value` is needed now.
void fused_flush_for(int32_t value);
// A storage whose value a pending trace still owes: runs the trace.
inline void settle(device::StorageBuffer& sb) {
  if (sb.pending >= 0) fused_flush_for(sb.pending);
}
// Pipelined flushes (TORCH_PJRT_FUSED_PIPELINE; see fused.cpp) on or off
// for what is recorded from now on; returns the previous setting.
bool set_fused_pipeline(bool on);
// A storage dies while the trace owes its value: the value never leaves.
void fused_forget(device::StorageBuffer* sb);

// Why the next implicit flush on this thread happens (host read, CPU
// fallback, ...), for the scope of the guard.
class FlushReason {
 public:
  explicit FlushReason(const char* why);
  ~FlushReason();
  static const char* current();

 private:
  const char* previous_;
};

struct FusedStats {
  int64_t ops_recorded = 0, flushes = 0, op_by_op_runs = 0, programs_compiled = 0, cache_hits = 0,
          compile_failures = 0, dead_traces = 0, max_ops_per_flush = 0, cache_size = 0;
  // Overwritten inputs donated to the fused program (their memory reused for
  // the new value), and those kept because something else still held them.
  int64_t donated_buffers = 0, not_donated_buffers = 0, donated_bytes = 0;
  int64_t programs_recorded = 0;  // compiled graphs recorded as one step of a trace
  int64_t pipeline_cuts_learned = 0;  // traces cut in two from their next sighting (pipelined flushes)
  // Sightings of a trace seen before that still ran op by op: it does not
  // recur in a tight loop and has not yet spent its compile time op by op.
  int64_t deferred_compiles = 0;
  // Sightings of a trace whose fused program was still compiling on a
  // compile thread: run op by op meanwhile (fused.cpp, compile_fused).
  int64_t runs_while_compiling = 0;
  double compile_seconds = 0;
  int64_t compiled_ops = 0;  // ops in the fused programs compiled (compile_seconds per op)
  std::map<std::string, int64_t> flushes_by_reason;
};
FusedStats fused_stats();
// Forgets every trace seen and its fused program (clear_executable_cache).
void fused_clear_programs();

}  // namespace torch_pjrt::eager
