// The legacy autograd profiler's device hooks for tpu
// (torch.autograd.profiler.profile(use_device="tpu")): each recorded op gets
// a device event, and an op's device time is the time between the events
// around it (device time: when the work queued before each completed). Without
// them every op's callback raised and the times came out as garbage.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "device/current_device.h"
#include "device/event_wait.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

struct TpuProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    int d = current_device();
    if (device) *device = static_cast<c10::DeviceIndex>(d);
    // Not a fused eager flush: a trace being recorded is measured when it runs.
    if (event) *event = runtime::Runtime::get().record_event(d);
    if (cpu_ns) *cpu_ns = c10::getTime();
  }
  // Microseconds, as CUDA's stubs.
  float elapsed(const ProfilerVoidEventStub* a, const ProfilerVoidEventStub* b) const override {
    auto* x = static_cast<const runtime::DeviceEvent*>(a->get());
    auto* y = static_cast<const runtime::DeviceEvent*>(b->get());
    if (!x || !y) return 0.f;
    wait_released(*x);
    wait_released(*y);
    return static_cast<float>(y->time_ns() - x->time_ns()) / 1e3f;
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    int was = current_device();
    for (int d = 0; d < device_count(); ++d) {
      set_current_device(d);
      op(d);
    }
    set_current_device(was);
  }
  void synchronize() const override {
    for (int d = 0; d < device_count(); ++d) runtime::Runtime::get().synchronize(d);
  }
};

const bool g_registered = [] {
  static TpuProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace torch_pjrt::device
