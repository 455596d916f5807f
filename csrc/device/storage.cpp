#include "device/storage.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "device/current_device.h"
#include "device/dtype_map.h"

namespace torch_pjrt::device {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<int64_t> g_allocated[kMaxDevices];
std::atomic<int64_t> g_peak[kMaxDevices];

// Fake addresses: unique, aligned, never reused, never dereferenced.
std::atomic<uint64_t> g_next_address{0x100000000000ull};

void account(int device, int64_t delta) {
  int64_t now = g_allocated[device] += delta;
  int64_t peak = g_peak[device].load();
  while (now > peak && !g_peak[device].compare_exchange_weak(peak, now)) {
  }
}

void delete_storage(void* ctx) {
  auto* sb = static_cast<StorageBuffer*>(ctx);
  account(sb->device, -static_cast<int64_t>(sb->nbytes));
  delete sb;
}

class PjrtAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    int dev = current_device();
    auto* sb = new StorageBuffer();
    sb->device = dev;
    sb->nbytes = nbytes;
    uint64_t span = ((nbytes ? nbytes : 1) + 255) & ~uint64_t(255);
    void* addr = reinterpret_cast<void*>(g_next_address.fetch_add(span));
    account(dev, static_cast<int64_t>(nbytes));
    return c10::DataPtr(addr, sb, &delete_storage,
                        c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev)));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "torch_pjrt: raw byte copies between tpu addresses are not supported; "
                       "use Tensor.copy_");
  }
};

PjrtAllocator g_allocator;

}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

StorageBuffer& storage_of(const c10::Storage& s) {
  void* ctx = s.data_ptr().get_context();
  TORCH_CHECK(ctx && s.data_ptr().get_deleter() == &delete_storage,
              "torch_pjrt: tensor storage was not allocated by the tpu allocator");
  return *static_cast<StorageBuffer*>(ctx);
}

StorageBuffer& storage_of(const at::Tensor& t) { return storage_of(t.storage()); }

const runtime::BufferPtr& ensure_buffer(StorageBuffer& sb, lowering::DType dtype) {
  if (!sb.buffer) {
    if (sb.nbytes % lowering::itemsize(dtype) != 0) dtype = lowering::DType::U8;
    std::vector<char> zeros(sb.nbytes ? sb.nbytes : 1, 0);
    int64_t n = static_cast<int64_t>(sb.nbytes) / lowering::itemsize(dtype);
    sb.buffer = runtime::Runtime::get().buffer_from_host(zeros.data(), to_pjrt(dtype), {n}, sb.device);
    sb.dtype = dtype;
  }
  return sb.buffer;
}

int64_t memory_allocated(int device) { return g_allocated[device].load(); }
int64_t max_memory_allocated(int device) { return g_peak[device].load(); }
void reset_peak_memory_stats(int device) { g_peak[device] = g_allocated[device].load(); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace torch_pjrt::device
