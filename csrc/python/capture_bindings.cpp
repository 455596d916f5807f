#include "python/capture_bindings.h"

#include <torch/csrc/utils/pybind.h>

#include "eager/step_capture.h"
#include "runtime/prefetch.h"

namespace py = pybind11;

namespace torch_pjrt::python {

namespace {
// The recording, opaque to Python.
struct RecordingHandle {
  std::shared_ptr<eager::Recording> r;
};
}  // namespace

void bind_capture(py::module& m) {
  py::class_<RecordingHandle>(m, "StepRecording");
  // Each releases the GIL: they take the device lock, which is never
  // waited for while holding the GIL.
  m.def("capture_begin", [] {
    py::gil_scoped_release release;
    eager::capture_begin();
  });
  m.def("capture_abort", [] {
    py::gil_scoped_release release;
    eager::capture_abort();
  });
  m.def("capture_end", [](const std::vector<at::Tensor>& args, const std::vector<at::Tensor>& returned) {
    std::shared_ptr<eager::Recording> r;
    {
      py::gil_scoped_release release;
      r = eager::capture_end(args, returned);
    }
    eager::capture_keep_leaves(*r);  // (under the GIL)
    return RecordingHandle{r};
  });
  m.def("capture_problem", [](const RecordingHandle& a, const RecordingHandle& b) {
    py::gil_scoped_release release;
    return eager::capture_problem(*a.r, *b.r);
  });
  m.def("capture_recording_problem", [](const RecordingHandle& r) { return eager::recording_problem(*r.r); });
  m.def("capture_recording_stale", [](const RecordingHandle& r) { return eager::recording_stale(*r.r); });
  m.def("capture_replay",
        [](const RecordingHandle& r, const std::vector<at::Tensor>& args) -> std::optional<std::vector<at::Tensor>> {
          if (eager::capture_leaves_changed(*r.r)) return std::nullopt;  // (under the GIL) stale: recorded again
          py::gil_scoped_release release;
          return eager::replay(*r.r, args);
        });
  m.def("capture_count_not_replayable", [] {
    py::gil_scoped_release release;
    eager::count_not_replayable();
  });
  // Warm start: the persistent-cache keys of the programs a step uses, and
  // loading them ahead in a new process.
  m.def("capture_note_programs", [](bool on) { runtime::prefetch::set_noting(on); });
  m.def("capture_noted_programs", [] { return runtime::prefetch::noted(); });
  m.def("capture_prefetch", [](const std::vector<std::pair<std::string, int64_t>>& keys) {
    py::gil_scoped_release release;
    runtime::prefetch::start(keys, [](const runtime::Sha256::Digest& key, size_t size) {
      return runtime::Runtime::get().load_by_key(key, size);
    });
  });
  m.def("capture_prefetch_stop", [] {
    py::gil_scoped_release release;
    runtime::prefetch::stop();
  });
  m.def("capture_metrics", [] {
    eager::CaptureStats s;
    {
      py::gil_scoped_release release;
      s = eager::capture_stats();
    }
    py::dict d;
    d["capture_recordings"] = s.recordings;
    d["capture_replays"] = s.replays;
    d["capture_not_replayable"] = s.not_replayable;
    auto p = runtime::prefetch::stats();
    d["capture_programs_prefetched"] = p.loaded;
    d["capture_prefetched_used"] = p.taken;
    return d;
  });
}

}  // namespace torch_pjrt::python
