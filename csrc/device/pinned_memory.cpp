#include "device/pinned_memory.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace torch_pjrt::device {
namespace {

std::mutex g_mutex;
// Live blocks by base address (their sizes): is_pinned answers for any
// address inside one, as for a storage sliced out of a pinned block.
auto& g_live = *new std::map<const char*, size_t>();  // leaked: used until exit
auto& g_stats = *new at::HostStats();

void add(at::HostStats& s, size_t bytes) {
  for (auto* stat : {&s.active_requests, &s.allocations}) {
    stat->current += 1;
    stat->allocated += 1;
    stat->peak = std::max(stat->peak, stat->current);
  }
  for (auto* stat : {&s.active_bytes, &s.allocated_bytes}) {
    stat->current += static_cast<int64_t>(bytes);
    stat->allocated += static_cast<int64_t>(bytes);
    stat->peak = std::max(stat->peak, stat->current);
  }
  s.num_host_alloc += 1;
}

void remove(at::HostStats& s, size_t bytes) {
  for (auto* stat : {&s.active_requests, &s.allocations}) {
    stat->current -= 1;
    stat->freed += 1;
  }
  for (auto* stat : {&s.active_bytes, &s.allocated_bytes}) {
    stat->current -= static_cast<int64_t>(bytes);
    stat->freed += static_cast<int64_t>(bytes);
  }
  s.num_host_free += 1;
}

void release(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_live.find(static_cast<const char*>(ptr));
    if (it != g_live.end()) {
      remove(g_stats, it->second);
      g_live.erase(it);
    }
  }
  std::free(ptr);
}

// Also PyTorch's host allocator for PrivateUse1 (torch.accelerator's
// empty_host_cache and host stats ask it). Nothing is cached: a block is
// freed when its last user lets go, and copies that read one hold it.
class PinnedAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* ptr = nbytes ? std::aligned_alloc(64, rounded) : nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, !nbytes || ptr, "torch_pjrt: could not allocate ", nbytes,
                     " bytes of pinned host memory");
    if (ptr) {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_live.emplace(static_cast<const char*>(ptr), rounded);
      add(g_stats, rounded);
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_stats;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto* stat : {&g_stats.active_requests, &g_stats.allocations, &g_stats.active_bytes, &g_stats.allocated_bytes}) {
      stat->allocated = 0;
      stat->freed = 0;
    }
    g_stats.num_host_alloc = g_stats.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto* stat : {&g_stats.active_requests, &g_stats.allocations, &g_stats.active_bytes, &g_stats.allocated_bytes})
      stat->peak = stat->current;
  }
};

PinnedAllocator& allocator() {
  static PinnedAllocator a;
  return a;
}

// Without it, torch.accelerator.empty_host_cache() dereferences an empty slot.
const bool g_registered = [] {
  at::setHostAllocator(c10::DeviceType::PrivateUse1, &allocator());
  return true;
}();

}  // namespace

c10::Allocator* pinned_memory_allocator() { return &allocator(); }

bool is_pinned_ptr(const void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_live.upper_bound(p);
  if (it == g_live.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace torch_pjrt::device
