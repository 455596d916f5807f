// The in-memory cache of compiled programs, shared by every frontend (eager
// op plans, internal view programs, compiled graphs): least recently used
// entries are evicted past a bound on entries and on bytes, so a process
// that sees ever new shapes keeps a flat footprint.
//
// Bounds: TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES (default 4096) and
// TORCH_PJRT_EXECUTABLE_CACHE_BYTES (a size such as "1GiB"; default 2 GiB)
// of the executables' generated code as the plugin reports it (a fixed
// estimate per entry when it reports none). 0 means no bound.
// And by the process's memory mappings (mappings.h): past
// TORCH_PJRT_EXECUTABLE_CACHE_MAPPINGS (default half of vm.max_map_count;
// 0: no bound), the least recently used eighth of the entries is dropped
// until the process is under it again (looked at after every 0.1 s of
// compiling or loading and every 64 insertions).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace torch_pjrt::runtime {

class ProgramCache {
 public:
  // The process's cache (bounds from the environment on first use).
  static ProgramCache& get();
  ProgramCache(int64_t max_entries, int64_t max_bytes);

  // The entry for `key`, now the most recently used; null when absent.
  // Repeated lookups of a key on one thread take no lock (a per-thread
  // front of the last keys found, valid while the cache drops nothing).
  std::shared_ptr<void> find(std::string_view key);
  // Inserts or replaces; evicts least recently used entries past the bounds
  // (never the one just inserted).
  void put(const std::string& key, std::shared_ptr<void> value, int64_t bytes);
  void clear();
  void set_bounds(int64_t max_entries, int64_t max_bytes);

  int64_t size() const;
  int64_t bytes() const;
  int64_t evictions() const;
  int64_t max_entries() const;
  int64_t max_bytes() const;
  int64_t mapping_evictions() const;

 private:
  // Drops old entries while the process's mappings are past the bound.
  void relieve_mapping_pressure();
  // The least recently used entry out; its value into `dropped` (released
  // outside the lock).
  void drop_oldest_locked(std::vector<std::shared_ptr<void>>* dropped);
  struct Entry {
    std::shared_ptr<void> value;
    int64_t bytes;
    std::list<std::string>::iterator order;
  };
  // Drops least recently used entries past the bounds, keeping at least one.
  void evict_locked(std::vector<std::shared_ptr<void>>* dropped);

  std::shared_ptr<void> find_locked(std::string_view key);

  mutable std::mutex mutex_;
  // Bumped whenever an entry is dropped or replaced: the per-thread fronts'
  // entries from before are not used.
  std::atomic<uint64_t> generation_{1};
  std::list<std::string> order_;  // most recently used first
  // (Looked up by string_view: an eager op's key is built in place.)
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> entries_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  int64_t max_entries_;
  int64_t max_bytes_;
  int64_t max_mappings_;
  int puts_since_sample_ = 0;
  static constexpr int sample_every_ = 64;
  double work_at_sample_ = 0;  // compile + load seconds when last looked
  int64_t mapping_evictions_ = 0;
};

}  // namespace torch_pjrt::runtime
