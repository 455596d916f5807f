#include "device/pinned_memory.h"

#include <cstdlib>
#include <mutex>
#include <unordered_set>

namespace torch_pjrt::device {
namespace {

std::mutex g_mutex;
auto& g_live = *new std::unordered_set<const void*>();  // leaked: used until exit

void release(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_live.erase(ptr);
  }
  std::free(ptr);
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? std::aligned_alloc(64, (nbytes + 63) / 64 * 64) : nullptr;
    if (ptr) {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_live.insert(ptr);
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

}  // namespace

c10::Allocator* pinned_memory_allocator() {
  static PinnedAllocator allocator;
  return &allocator;
}

bool is_pinned_ptr(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_live.count(ptr) > 0;
}

}  // namespace torch_pjrt::device
