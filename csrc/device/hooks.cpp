// PrivateUse1 hooks (generators, availability) and the tpu generator.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <memory>
#include <mutex>
#include <vector>

#include "device/current_device.h"
#include "device/generator.h"
#include "device/pinned_memory.h"
#include "device/storage.h"

namespace torch_pjrt::device {
namespace {

// CPUGeneratorImpl's engine and state format, relabelled as a tpu generator
// (so get/set_rng_state work unchanged).
class PjrtGeneratorImpl : public at::CPUGeneratorImpl {
 public:
  explicit PjrtGeneratorImpl(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

  // Generator.__reduce__ (pickle, copy.deepcopy) asks any non-CPU generator
  // for its offset and __setstate__ sets it back; CPU's engine has none, and
  // its get_offset raises. The engine's whole state travels in get_state().
  uint64_t get_offset() const override { return 0; }
  void set_offset(uint64_t offset) override {
    if (offset != 0) at::CPUGeneratorImpl::set_offset(offset);  // CPU's error: the engine has no offset
  }

 private:
  // Generator.clone_state() and graph-safe copies: a tpu generator (CPU's
  // clone would relabel it a CPU one).
  PjrtGeneratorImpl* clone_impl() const override {
    auto* gen = new PjrtGeneratorImpl(device_.index());
    gen->set_state(*get_state());
    return gen;
  }
};

std::vector<at::Generator>& generators() {
  static std::vector<at::Generator> g;
  return g;
}

std::once_flag g_generators_once;

struct PjrtHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(current_device()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = getCurrentDevice();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index < 0 ? current_device() : index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    int i = index < 0 ? current_device() : index;
    int n = device_count();
    TORCH_CHECK(n == 0 || i < n, "torch_pjrt: invalid device index ", i, " for a generator (", n, " tpu devices)");
    return at::make_generator<PjrtGeneratorImpl>(static_cast<c10::DeviceIndex>(i));
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_memory_allocator(); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device()));
  }
};

PjrtHooks g_hooks;

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(&g_hooks); }
} g_register_hooks;

}  // namespace

const at::Generator& default_generator(int device) {
  std::call_once(g_generators_once, [] {
    int n = device_count();
    for (int i = 0; i < n; ++i) {
      generators().push_back(at::make_generator<PjrtGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
      generators().back().set_current_seed(c10::detail::getNonDeterministicRandom());
    }
  });
  TORCH_CHECK(device >= 0 && device < static_cast<int>(generators().size()),
              "torch_pjrt: invalid device index ", device, " for a generator (", generators().size(),
              " tpu device(s))");
  return generators()[device];
}

namespace {
thread_local std::optional<std::pair<uint64_t, uint64_t>> forced_key;
}

void force_rng_key(std::optional<std::pair<uint64_t, uint64_t>> key) { forced_key = key; }
const std::optional<std::pair<uint64_t, uint64_t>>& forced_rng_key() { return forced_key; }

std::pair<uint64_t, uint64_t> next_rng_key(const std::optional<at::Generator>& gen, int device) {
  if (forced_key) return *forced_key;
  at::Generator g = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "torch_pjrt: expected a tpu generator, got one for ", g.device());
  auto* impl = static_cast<at::CPUGeneratorImpl*>(g.unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lock(g.mutex());
  uint64_t a = impl->random64();
  uint64_t b = impl->random64();
  return {a, b};
}

}  // namespace torch_pjrt::device
