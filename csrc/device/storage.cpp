#include "device/storage.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "device/current_device.h"
#include "device/dtype_map.h"
#include "eager/executor.h"
#include "eager/fused.h"

namespace torch_pjrt::device {
namespace {

// Fake addresses: unique, aligned, never reused, never dereferenced.
constexpr uint64_t kFirstAddress = 0x100000000000ull;
std::atomic<uint64_t> g_next_address{kFirstAddress};

void delete_storage(void* ctx) {
  auto* sb = static_cast<StorageBuffer*>(ctx);
  if (sb->pending >= 0) eager::fused_forget(sb);  // a value that dies inside its trace
  delete sb;
}

// Memory is counted by the runtime per buffer (runtime_memory.cpp): a storage
// counts from its first write, when it gets one.
c10::DataPtr make_data_ptr(size_t nbytes, int dev, StorageBuffer* sb) {
  sb->device = dev;
  sb->nbytes = nbytes;
  uint64_t span = ((nbytes ? nbytes : 1) + 255) & ~uint64_t(255);
  void* addr = reinterpret_cast<void*>(g_next_address.fetch_add(span));
  return c10::DataPtr(addr, sb, &delete_storage,
                      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev)));
}

constexpr int kMaxDevices = 256;
std::atomic<int64_t> g_reserved_peak[kMaxDevices];  // when the plugin reports bytes_reserved

int checked_index(c10::DeviceIndex device) { return device < 0 ? current_device() : device; }

// A c10::DeviceAllocator, so torch.accelerator's memory calls
// (memory_allocated, memory_stats, reset_peak_memory_stats, empty_cache,
// get_memory_info) reach the runtime's per-buffer accounting, the same
// figures torch.tpu reports. There is no cache of ours: every live buffer is
// one allocated, active, reserved block.
class PjrtAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    int dev = current_device();
    // An allocation larger than what is left raises here, at the op that asked.
    if (nbytes > 0) runtime::Runtime::get().ensure_fits(dev, static_cast<int64_t>(nbytes), "a new tensor");
    return make_data_ptr(nbytes, dev, new StorageBuffer());
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "torch_pjrt: raw byte copies between tpu addresses are not supported; "
                       "use Tensor.copy_");
  }

  bool initialized() override { return runtime::Runtime::initialized() && !runtime::in_forked_child(); }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    if (initialized()) runtime::Runtime::get().release_finished(-1);
  }
  // One stream per device, and buffers are freed only when PJRT is done with them.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return device_stats(checked_index(device));
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    int d = checked_index(device);
    runtime::Runtime::get().check_device(d);
    runtime::reset_accumulated(d);
  }
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak_memory(checked_index(device)); }
  // No `override`: the base declares it from torch 2.10 on (torch.accelerator.get_memory_info).
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) {
    auto [free, total] = runtime::Runtime::get().mem_get_info(checked_index(device));
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }
};

PjrtAllocator g_allocator;

// Zeros made on the host and copied over: cheap for small storages.
constexpr size_t kHostZerosLimit = size_t(1) << 20;

}  // namespace

c10::Allocator* allocator() { return &g_allocator; }

ReservedBytes reserved_bytes(int device) {
  runtime::MemoryStats s = runtime::Runtime::get().memory_stats(device);
  ReservedBytes r;
  if (s.plugin_bytes_reserved > 0) {
    r.current = s.plugin_bytes_reserved;
    int64_t peak = g_reserved_peak[device].load();
    while (r.current > peak && !g_reserved_peak[device].compare_exchange_weak(peak, r.current)) {
    }
    r.peak = std::max(peak, r.current);
  } else {
    r.current = s.allocated;
    r.peak = s.peak;
  }
  return r;
}

void reset_peak_memory(int device) {
  runtime::Runtime& rt = runtime::Runtime::get();
  rt.reset_peak(device);
  runtime::MemoryStats s = rt.memory_stats(device);
  g_reserved_peak[device] = s.plugin_bytes_reserved;
}

c10::CachingDeviceAllocator::DeviceStats device_stats(int device) {
  ReservedBytes reserved = reserved_bytes(device);  // also lets finished work go, like memory_stats
  runtime::AllocationCounters c = runtime::allocation_counters(device);
  c10::CachingDeviceAllocator::DeviceStats st;
  constexpr size_t all = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  auto set = [](c10::CachingDeviceAllocator::Stat& stat, int64_t current, int64_t peak, int64_t allocated,
                int64_t freed) {
    stat.current = current;
    stat.peak = peak;
    stat.allocated = allocated;
    stat.freed = freed;
  };
  for (auto* stat : {&st.allocation[all], &st.segment[all], &st.active[all]})
    set(*stat, c.count_current, c.count_peak, c.count_allocated, c.count_freed);
  for (auto* stat : {&st.allocated_bytes[all], &st.active_bytes[all], &st.requested_bytes[all]})
    set(*stat, c.bytes_current, c.bytes_peak, c.bytes_allocated, c.bytes_freed);
  set(st.reserved_bytes[all], reserved.current, reserved.peak, c.bytes_allocated, c.bytes_freed);
  st.num_alloc_retries = runtime::metrics().memory_drains.load();
  st.num_ooms = runtime::metrics().out_of_memory_errors.load();
  return st;
}

StorageBuffer& storage_of(const c10::Storage& s) {
  void* ctx = s.data_ptr().get_context();
  if (ctx && s.data_ptr().get_deleter() == &delete_storage) return *static_cast<StorageBuffer*>(ctx);
  // A tensor made by at::from_blob over a tpu storage's (fake) address: the
  // address names no memory to read. (PyTorch's legacy serialization, which
  // does this, goes through a CPU copy: torch_pjrt/_legacy_save.py.)
  auto addr = reinterpret_cast<uint64_t>(s.data_ptr().get());
  TORCH_CHECK(!(addr >= kFirstAddress && addr < g_next_address.load()),
              "torch_pjrt: a slice of a tpu storage (storage[a:b]), or a tensor made from a tpu storage's "
              "address (from_blob), has no memory behind it on tpu: take a view of the tensor instead "
              "(tensor.view(-1)[a:b]), or copy it to the CPU first");
  TORCH_CHECK(false, "torch_pjrt: tensor storage was not allocated by the tpu allocator");
}

StorageBuffer& storage_of(const at::Tensor& t) { return storage_of(t.storage()); }

const runtime::BufferPtr& ensure_buffer(StorageBuffer& sb, lowering::DType dtype) {
  eager::settle(sb);  // a fused trace owes the value: run it
  if (!sb.buffer) {
    if (sb.nbytes % lowering::itemsize(dtype) != 0) dtype = lowering::DType::U8;
    int64_t n = static_cast<int64_t>(sb.nbytes) / lowering::itemsize(dtype);
    if (sb.nbytes <= kHostZerosLimit) {
      std::vector<char> zeros(sb.nbytes ? sb.nbytes : 1, 0);
      sb.buffer = runtime::Runtime::get().buffer_from_host(zeros.data(), to_pjrt(dtype), {n}, sb.device);
    } else {
      // Large: filled on the device, so no host memory of that size is needed.
      std::string key = "$zeros|" + std::to_string(static_cast<int>(dtype)) + "|" + std::to_string(n);
      sb.buffer = eager::run_cached(key, {}, sb.device, [&](lowering::Builder& b) {
        return std::vector<lowering::Value>{b.zeros(lowering::TensorType{dtype, {n}})};
      })[0];
    }
    sb.dtype = dtype;
  }
  return sb.buffer;
}

at::Tensor wrap_buffer(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype, int device,
                       runtime::BufferPtr buffer) {
  size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, c10::elementSize(dtype));
  auto* sb = new StorageBuffer();
  c10::DataPtr data = make_data_ptr(nbytes, device, sb);
  if (nbytes > 0) {
    sb->buffer = std::move(buffer);
    sb->dtype = to_dtype(dtype);
  }
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &g_allocator, true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          caffe2::TypeMeta::fromScalarType(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

namespace {
at::Tensor flat_view(c10::Storage storage, c10::ScalarType dtype, int64_t numel) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          caffe2::TypeMeta::fromScalarType(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}
}  // namespace

void resize_storage_bytes(const c10::Storage& storage, size_t newsize) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  StorageBuffer& old = storage_of(storage);
  const int dev = old.device;
  if (newsize > 0)
    runtime::Runtime::get().ensure_fits(dev, static_cast<int64_t>(newsize), "a resized storage");
  c10::Storage fresh(c10::Storage::use_byte_size_t(), newsize,
                     make_data_ptr(newsize, dev, new StorageBuffer()), &g_allocator, true);
  eager::settle(old);  // a fused trace owes the old value: run it
  const size_t keep = std::min(old.nbytes, newsize);
  if (keep > 0 && old.buffer) {
    // The kept prefix, copied on the device in the storage's element type.
    const int64_t item = lowering::itemsize(old.dtype);
    TORCH_CHECK_NOT_IMPLEMENTED(keep % item == 0, "torch_pjrt: resizing a tpu storage of ", old.nbytes,
                                " bytes to ", newsize, " bytes would split an element of its ",
                                c10::toString(to_scalar_type(old.dtype)), " values");
    const auto dtype = to_scalar_type(old.dtype);
    flat_view(fresh, dtype, keep / item).copy_(flat_view(storage, dtype, keep / item));
  }
  // FSDP2 frees an unsharded parameter with resize_(0) and brings it back
  // with resize_(n) before gathering into it: the storage object stays, its
  // buffer is replaced.
  impl->set_data_ptr_noswap(
      fresh.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::PrivateUse1, dev))));
  impl->set_nbytes(newsize);
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace torch_pjrt::device
