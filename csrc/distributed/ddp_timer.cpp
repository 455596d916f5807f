// DDP's runtime statistics on tpu (DDPLoggingData: forward, backward compute
// and communication times). DDP looks a timer up by device type and, without
// one, warns on every process ("Time stats are currently only collected for
// CPU and CUDA devices"). Host timestamps, as PyTorch's CPU timer: the
// communication end is recorded when the collective's future completes,
// after the copy back.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace torch_pjrt::distributed {
namespace {

class HostClockTimer : public c10d::Timer {
 public:
  explicit HostClockTimer(c10::Device /*device*/) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t a = getTimeRef(start), b = getTimeRef(end);
    // Unset, or an end from an earlier iteration: no span.
    if (a == c10d::kUnsetTime || b == c10d::kUnsetTime || b < a) return std::nullopt;
    return b - a;
  }
};

}  // namespace
}  // namespace torch_pjrt::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_pjrt::distributed::HostClockTimer);
}  // namespace c10d
