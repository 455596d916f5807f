#include "runtime/program_cache.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "runtime/byte_size.h"
#include "runtime/mappings.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::runtime {
namespace {

int64_t env_size(const char* name, int64_t dflt, bool bytes) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  std::optional<int64_t> n = parse_byte_size(v);
  if (!n || (!bytes && std::string(v).find_first_not_of("0123456789 ") != std::string::npos &&
             std::string(v) != "none" && std::string(v) != "unlimited"))
    throw std::invalid_argument(std::string("torch_pjrt: ") + name + " must be " +
                                (bytes ? "a size in bytes (e.g. 2GiB, 500M; 0 or none: no bound)"
                                       : "a number of entries (0 or none: no bound)") +
                                ", got '" + v + "'");
  return *n;
}

}  // namespace

ProgramCache& ProgramCache::get() {
  // Leaked on purpose: executables must not be destroyed after the plugin at exit.
  static ProgramCache* cache =
      new ProgramCache(env_size("TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES", 4096, false),
                       env_size("TORCH_PJRT_EXECUTABLE_CACHE_BYTES", int64_t(2) << 30, true));
  return *cache;
}

ProgramCache::ProgramCache(int64_t max_entries, int64_t max_bytes)
    : max_entries_(max_entries),
      max_bytes_(max_bytes),
      max_mappings_(env_size("TORCH_PJRT_EXECUTABLE_CACHE_MAPPINGS", mapping_limit() / 2, false)) {}

namespace {
// One thread's last finds, direct-mapped by the key's hash: a loop's ops
// (an eager op is looked up per call) find their programs without the lock.
// Weak: the front keeps nothing alive that the cache has dropped.
struct FrontEntry {
  const void* cache = nullptr;
  uint64_t generation = 0;
  size_t hash = 0;
  uint32_t hits = 0;
  std::string key;
  std::weak_ptr<void> value;
};
constexpr size_t kFrontEntries = 256;
// Every this many front hits an entry goes through the locked path, which
// keeps its place in the least-recently-used order (a program used once
// per fewer than max_entries - 16 new programs is never evicted).
constexpr uint32_t kTouchEvery = 16;
thread_local std::array<FrontEntry, kFrontEntries> t_front;
}  // namespace

std::shared_ptr<void> ProgramCache::find(std::string_view key) {
  size_t hash = std::hash<std::string_view>{}(key);
  FrontEntry& f = t_front[hash % kFrontEntries];
  uint64_t generation = generation_.load(std::memory_order_acquire);
  if (f.cache == this && f.generation == generation && f.hash == hash && ++f.hits % kTouchEvery != 0 &&
      f.key == key)
    if (auto value = f.value.lock()) return value;
  std::shared_ptr<void> value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    value = find_locked(key);
    generation = generation_.load(std::memory_order_relaxed);  // (as of this value)
  }
  if (value) {
    if (f.cache != this || f.hash != hash || f.key != key) {
      f.key.assign(key);
      f.hash = hash;
      f.cache = this;
      f.hits = 0;
    }
    f.generation = generation;
    f.value = value;
  }
  return value;
}

std::shared_ptr<void> ProgramCache::find_locked(std::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second.order);
  return it->second.value;
}

void ProgramCache::put(const std::string& key, std::shared_ptr<void> value, int64_t bytes) {
  std::vector<std::shared_ptr<void>> dropped;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      generation_.fetch_add(1, std::memory_order_release);
      bytes_ -= it->second.bytes;
      dropped.push_back(std::move(it->second.value));
      order_.erase(it->second.order);
      entries_.erase(it);
    }
    order_.push_front(key);
    entries_.emplace(key, Entry{std::move(value), bytes, order_.begin()});
    bytes_ += bytes;
    evict_locked(&dropped);
  }
  dropped.clear();
  relieve_mapping_pressure();
}

void ProgramCache::relieve_mapping_pressure() {
  // When to look (reading the mappings costs ~0.4 us each, 12 ms at 30,000):
  // an executable's mappings grow with its compile time (here 100-400 a
  // second: 2,118 for a 6.6 s compile, 6 for 50 ms), so after every 0.1 s of
  // compiling and loading (at most a few hundred unseen mappings), and after
  // 64 insertions.
  double work = metrics().compile_seconds.load() + metrics().persistent_cache_load_seconds.load();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (max_mappings_ <= 0) return;
    if (++puts_since_sample_ < sample_every_ && work - work_at_sample_ < 0.1) return;
    puts_since_sample_ = 0;
    work_at_sample_ = work;
  }
  int64_t now = process_mappings();
  if (now < 0) return;
  for (int round = 0; now > max_mappings_ && round < 8; ++round) {
    std::vector<std::shared_ptr<void>> dropped;  // executables unmapped when these go
    {
      std::lock_guard<std::mutex> lock(mutex_);
      size_t n = std::max<size_t>(1, entries_.size() / 8);
      while (n-- > 0 && entries_.size() > 1) {
        drop_oldest_locked(&dropped);
        ++mapping_evictions_;
      }
    }
    if (dropped.empty()) break;
    dropped.clear();
    now = process_mappings();
  }
}

void ProgramCache::evict_locked(std::vector<std::shared_ptr<void>>* dropped) {
  while (entries_.size() > 1 &&
         ((max_entries_ > 0 && static_cast<int64_t>(entries_.size()) > max_entries_) ||
          (max_bytes_ > 0 && bytes_ > max_bytes_)))
    drop_oldest_locked(dropped);
}

void ProgramCache::drop_oldest_locked(std::vector<std::shared_ptr<void>>* dropped) {
  auto victim = entries_.find(order_.back());
  bytes_ -= victim->second.bytes;
  dropped->push_back(std::move(victim->second.value));
  entries_.erase(victim);
  order_.pop_back();
  ++evictions_;
  generation_.fetch_add(1, std::memory_order_release);
}

void ProgramCache::clear() {
  decltype(entries_) dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  dropped.swap(entries_);
  order_.clear();
  bytes_ = 0;
  generation_.fetch_add(1, std::memory_order_release);
}

void ProgramCache::set_bounds(int64_t max_entries, int64_t max_bytes) {
  std::vector<std::shared_ptr<void>> dropped;
  std::lock_guard<std::mutex> lock(mutex_);
  max_entries_ = max_entries;
  max_bytes_ = max_bytes;
  evict_locked(&dropped);
}

int64_t ProgramCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}
int64_t ProgramCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}
int64_t ProgramCache::evictions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return evictions_;
}
int64_t ProgramCache::max_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return max_entries_;
}
int64_t ProgramCache::mapping_evictions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return mapping_evictions_;
}
int64_t ProgramCache::max_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return max_bytes_;
}

}  // namespace torch_pjrt::runtime
