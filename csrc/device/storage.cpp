#include "device/storage.h"

#include <ATen/EmptyTensor.h>

#include <atomic>
#include <vector>

#include "device/current_device.h"
#include "device/dtype_map.h"
#include "eager/executor.h"

namespace torch_pjrt::device {
namespace {

// Fake addresses: unique, aligned, never reused, never dereferenced.
std::atomic<uint64_t> g_next_address{0x100000000000ull};

void delete_storage(void* ctx) { delete static_cast<StorageBuffer*>(ctx); }

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

class PjrtAllocator final : public c10::Allocator {
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
};

PjrtAllocator g_allocator;

// Zeros made on the host and copied over: cheap for small storages.
constexpr size_t kHostZerosLimit = size_t(1) << 20;

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

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

}  // namespace torch_pjrt::device
