// Device guard and current-device state for PrivateUse1 ("tpu").
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "device/current_device.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {
namespace {

thread_local int t_current_device = 0;

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
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    runtime::Runtime::get().synchronize(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, PjrtGuardImpl);

}  // namespace

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
