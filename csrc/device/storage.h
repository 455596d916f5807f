// Device storage: what a tpu tensor's DataPtr points at.
//
// PJRT buffers are immutable, so a storage is a mutable slot holding the
// current buffer (a flat 1-D array). Writing to any view of the storage swaps
// in a new buffer, so every tensor sharing the storage sees the write, exactly
// as PyTorch's view semantics require. The DataPtr's address is a unique fake
// address (never dereferenced) so data_ptr() arithmetic stays meaningful.
#pragma once

#include <ATen/core/Tensor.h>
#include <atomic>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include "lowering/types.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {

struct StorageBuffer {
  int device = 0;
  size_t nbytes = 0;
  // Element type of `buffer`; the buffer holds nbytes / itemsize(dtype) elements.
  lowering::DType dtype = lowering::DType::U8;
  // Null until first written; reads see zeros, so nothing reads garbage.
  runtime::BufferPtr buffer;
  // Fused eager: >= 0 while a recorded trace owes this storage's value (its
  // value id there; `buffer` is null until the trace runs), and the
  // storage's place in the trace's list of written storages.
  // Atomic: a storage may die on another thread (a tensor freed there), whose
  // deleter then waits for the device lock (eager/fused.h, fused_forget).
  std::atomic<int32_t> pending{-1};
  int32_t pending_slot = -1;
  // Unique per storage, increasing: step capture tells storages made during
  // a step from those that existed before it.
  uint64_t serial = next_serial();
  static uint64_t next_serial() {
    static std::atomic<uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t numel() const { return static_cast<int64_t>(nbytes) / lowering::itemsize(dtype); }
};

c10::Allocator* allocator();

// Memory figures shared by torch.tpu and torch.accelerator (the allocator is
// a c10::DeviceAllocator). Reserved: the plugin's bytes_reserved where it
// reports one, else what is allocated (no caching allocator of ours).
struct ReservedBytes {
  int64_t current = 0;
  int64_t peak = 0;
};
ReservedBytes reserved_bytes(int device);
// Peaks (allocated bytes, buffer count, reserved) start again from now.
void reset_peak_memory(int device);
// PyTorch's allocator statistics ("all" pool only) from the runtime's
// per-buffer accounting; memory_stats() keys such as allocated_bytes.all.current.
c10::CachingDeviceAllocator::DeviceStats device_stats(int device);
StorageBuffer& storage_of(const at::Tensor& t);
StorageBuffer& storage_of(const c10::Storage& s);

// The buffer of `sb`, created as zeros of `dtype` if it was never written.
const runtime::BufferPtr& ensure_buffer(StorageBuffer& sb, lowering::DType dtype);

// Storage.resize_ on tpu (PrivateUse1HooksInterface::resizePrivateUse1Bytes):
// a new buffer of `newsize` bytes, the old bytes up to the smaller size kept.
void resize_storage_bytes(const c10::Storage& storage, size_t newsize);

// A new tpu tensor whose storage holds `buffer` (elements of `dtype` in the
// layout `sizes`/`strides`): program results. Unlike at::empty it does not
// check the memory limit again; the program's outputs were counted at launch.
at::Tensor wrap_buffer(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype, int device,
                       runtime::BufferPtr buffer);

}  // namespace torch_pjrt::device
