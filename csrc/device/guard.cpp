// Device guard and current-device state for PrivateUse1 ("tpu"), and the
// streams and events PyTorch's generic torch.Stream / torch.Event (and so
// torch.accelerator and torch.tpu.Stream / Event) go through.
//
// Streams: a device runs its executions as PJRT orders them, and PJRT
// already makes every execution wait for the buffers it reads (also across
// devices), so a device has one queue and Stream.wait_event / wait_stream
// (block) need not wait. Streams still have their own ids (the default one is
// 0; each new one another), all on that queue, and a current stream per
// thread and device: PyTorch's stream context (`with torch.Stream(...)`)
// switches device and stream only when the stream is not the current one.
//
// Events: runtime::DeviceEvent, completing when the work launched on the
// device before the recording has completed, timed at that completion.
#include <Python.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <vector>
#if __has_include(<c10/core/DeviceCapability.h>)
#include <c10/core/DeviceCapability.h>
#define TORCH_PJRT_HAS_DEVICE_CAPABILITY 1
#endif

#include "device/current_device.h"
#include "device/dtype_map.h"
#include "device/event_wait.h"
#include "eager/fused.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {
namespace {

thread_local int t_current_device = 0;

// What c10's `void* event` points at; re-recording replaces the marker.
struct EventSlot {
  runtime::DeviceEventPtr marker;
};

int stream_device(const c10::Stream& s) { return s.device_index() < 0 ? t_current_device : s.device_index(); }

c10::Device tpu_device(c10::Device d) {
  return c10::Device(c10::DeviceType::PrivateUse1,
                     static_cast<c10::DeviceIndex>(d.index() < 0 ? t_current_device : d.index()));
}

c10::Stream default_stream(c10::Device d) { return c10::Stream(c10::Stream::DEFAULT, tpu_device(d)); }

void check_device(int index) { runtime::Runtime::get().check_device(index); }

// Current stream ids by device (0: the default stream), per thread as CUDA's.
thread_local std::vector<c10::StreamId> t_current_stream;
std::atomic<c10::StreamId> g_next_stream{1};

c10::Stream current_stream(c10::Device d) {
  c10::Device dev = tpu_device(d);
  size_t i = static_cast<size_t>(dev.index());
  c10::StreamId id = i < t_current_stream.size() ? t_current_stream[i] : 0;
  return c10::Stream(c10::Stream::UNSAFE, dev, id);
}

struct PjrtGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kType, static_cast<c10::DeviceIndex>(t_current_device));
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "torch_pjrt: expected a tpu device, got ", d);
    set_current_device(d.index() < 0 ? 0 : d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*isHighPriority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    c10::Device dev = tpu_device(d);
    check_device(dev.index());
    return c10::Stream(c10::Stream::UNSAFE, dev, g_next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = current_stream(s.device());
    size_t i = static_cast<size_t>(old.device_index());
    if (t_current_stream.size() <= i) t_current_stream.resize(i + 1, 0);
    t_current_stream[i] = s.id();
    return old;
  }
  bool queryStream(const c10::Stream& s) const override { return runtime::Runtime::get().idle(stream_device(s)); }
  void synchronizeStream(const c10::Stream& s) const override {
    eager::fused_flush("synchronize");
    runtime::Runtime::get().synchronize(stream_device(s));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag: timing is always on, it costs nothing*/) const override {
    TORCH_CHECK(stream.device_type() == kType, "torch_pjrt: a tpu event cannot be recorded on ", stream);
    int dev = stream_device(stream);
    TORCH_CHECK(device_index < 0 || device_index == dev, "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ", dev, ".");
    eager::fused_flush("event");  // the event marks recorded work as queued
    runtime::DeviceEventPtr marker = runtime::Runtime::get().record_event(dev);
    auto* slot = static_cast<EventSlot*>(*event);
    if (!slot) *event = slot = new EventSlot();
    slot->marker = std::move(marker);
  }
  // Work queued after this on any device that reads what the recorded work
  // wrote already waits for it (PJRT buffer dependencies), so nothing to add.
  void block(void* /*event*/, const c10::Stream& stream) const override {
    TORCH_CHECK(stream.device_type() == kType, "torch_pjrt: a tpu event cannot block ", stream);
  }
  bool queryEvent(void* event) const override {
    auto* slot = static_cast<EventSlot*>(event);
    return !slot || !slot->marker || slot->marker->ready();
  }
  void synchronizeEvent(void* event) const override {
    auto* slot = static_cast<EventSlot*>(event);
    if (slot && slot->marker) wait_released(*slot->marker);
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<EventSlot*>(event);
  }
  // Milliseconds between the two completions (c10::Event checked both are recorded and complete).
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<EventSlot*>(start);
    auto* b = static_cast<EventSlot*>(end);
    TORCH_CHECK(a && a->marker && b && b->marker, "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->marker->device() == b->marker->device(), "torch_pjrt: elapsed_time between events of tpu:",
                a->marker->device(), " and tpu:", b->marker->device(), "; record both on one device");
    wait_released(*a->marker);
    wait_released(*b->marker);
    return static_cast<double>(b->marker->time_ns() - a->marker->time_ns()) / 1e6;
  }
#ifdef TORCH_PJRT_HAS_DEVICE_CAPABILITY
  // The dtypes a tpu tensor can have (device/dtype_map.h).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device(tpu_device(d).index());
    c10::DeviceCapability cap;
#define TORCH_PJRT_SUPPORTED(_, name) \
  cap.capability_data.supported_scalar_types.has_##name = is_supported_dtype(c10::ScalarType::name);
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(TORCH_PJRT_SUPPORTED)
#undef TORCH_PJRT_SUPPORTED
    return cap;
  }
#endif
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    check_device(index);
    runtime::Runtime::get().synchronize(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuardImpl);

}  // namespace

void wait_released(const runtime::DeviceEvent& e) {
  if (e.ready()) return;
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    e.wait();
    PyEval_RestoreThread(state);
  } else {
    e.wait();
  }
}

int current_device() { return t_current_device; }

void set_current_device(int index) {
  const runtime::Runtime* rt = runtime::Runtime::get_unchecked();
  if (rt) rt->check_device(index);
  t_current_device = index;
}

// Answers in a forked child too (PyTorch asks while seeding or starting
// autograd threads there), without touching the plugin.
int device_count() {
  const runtime::Runtime* rt = runtime::Runtime::get_unchecked();
  return rt ? rt->device_count() : 0;
}

}  // namespace torch_pjrt::device
