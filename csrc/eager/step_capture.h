// Step capture (torch_pjrt.capture_step): a training or inference step run
// under fused eager is recorded as one trace; once two consecutive calls
// have recorded the same trace from the same state, later calls replay its
// fused program directly, without running the step's Python, autograd or
// optimizer code (what CUDA graphs do for CUDA). See docs/ARCHITECTURE.md,
// "Step capture".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch_pjrt::eager {

struct Recording;

// Starts recording a step (pending fused work runs first). The caller has a
// fused() region open around the step.
void capture_begin();
// Ends the recording: runs the step's trace and returns it, resolved against
// the step's tensor arguments (`args`) and the tensors it returned.
std::shared_ptr<Recording> capture_end(const std::vector<at::Tensor>& args, const std::vector<at::Tensor>& returned);
// Ends a recording whose step raised.
void capture_abort();
// The flags of the leaf tensors the step took (parameters, frozen or not),
// kept once the recording ended; then, before each replay, whether one of
// them was frozen or unfrozen since (requires_grad_), which makes `r` stale:
// autograd would now compute other grads, so the optimizer would step other
// parameters. Both are called with the GIL held (a tensor's Python object
// keeps it alive then, so its flag is read without taking a reference).
void capture_keep_leaves(Recording& r);
bool capture_leaves_changed(const Recording& r);
// Why `r` cannot be replayed whatever the other recordings (empty: it may be).
std::string recording_problem(const Recording& r);
// Whether a replay of `r` found a storage it reads or writes no longer held
// by anything else, or a tensor the step read or wrote frozen or unfrozen
// (requires_grad changed) since the recording (the step should be recorded
// again).
bool recording_stale(const Recording& r);
// Why `b` cannot be replayed: its own problem, or how it differs from `a`,
// the recording of the call before (empty: replayable; `b` then keeps which
// random keys a replay draws anew).
std::string capture_problem(const Recording& a, Recording& b);
// Runs the recorded step on new arguments (tpu tensors of the recorded
// geometry). Returns one tensor per tensor the step returned: a new tensor
// for a value the step computes, else the tensor it returned when recorded.
// Nothing (and nothing runs) when the arguments share storages differently
// from the recorded ones, or share one with the step's held state: the
// caller runs the step itself.
std::optional<std::vector<at::Tensor>> replay(const Recording& r, const std::vector<at::Tensor>& args);

// A host read of a tpu tensor's values (`what`: how); while a step is
// recorded it makes the recording unreplayable (a replay would reuse the
// value read then). Nothing otherwise.
void capture_host_read(const char* what);

// The tensors a compiled graph takes, while a step is recorded: a replay
// checks that the leaves among them are not frozen or unfrozen since (their
// graph would be another). Nothing otherwise.
void capture_note_leaves(const std::vector<at::Tensor>& inputs);

struct CaptureStats {
  int64_t recordings = 0, replays = 0, not_replayable = 0;
};
CaptureStats capture_stats();
void count_not_replayable();

}  // namespace torch_pjrt::eager
