// Device memory: every live buffer's bytes per device (so memory held by
// queued work counts), the memory limit, out-of-memory errors before the
// plugin runs out, and the plugin's own figures where it reports them.
#include <unistd.h>

#include <fstream>
#include <string>

#include "runtime/byte_size.h"
#include "runtime/pjrt_runtime.h"
#include "runtime/pjrt_util.h"

namespace torch_pjrt::runtime {
namespace {

constexpr int kMaxDevices = 256;
std::atomic<int64_t> g_live[kMaxDevices];
std::atomic<int64_t> g_peak[kMaxDevices];

// Buffer counts and accumulated figures (DeviceAllocator statistics).
std::atomic<int64_t> g_count[kMaxDevices];
std::atomic<int64_t> g_count_peak[kMaxDevices];
std::atomic<int64_t> g_bytes_allocated[kMaxDevices];
std::atomic<int64_t> g_bytes_freed[kMaxDevices];
std::atomic<int64_t> g_count_allocated[kMaxDevices];
std::atomic<int64_t> g_count_freed[kMaxDevices];

void raise_peak(std::atomic<int64_t>& peak_slot, int64_t now) {
  int64_t peak = peak_slot.load();
  while (now > peak && !peak_slot.compare_exchange_weak(peak, now)) {
  }
}

// `count` buffers of `bytes` in all created (`created`) or destroyed on `device`.
void account(int device, int64_t bytes, bool created, int64_t count = 1) {
  if (device < 0 || device >= kMaxDevices) return;
  if (created) {
    raise_peak(g_peak[device], g_live[device].fetch_add(bytes) + bytes);
    g_bytes_allocated[device] += bytes;
    g_count_allocated[device] += count;
    raise_peak(g_count_peak[device], g_count[device].fetch_add(count) + count);
  } else {
    g_live[device] -= bytes;
    g_bytes_freed[device] += bytes;
    g_count_freed[device] += count;
    g_count[device] -= count;
  }
}

// Host RAM, or the cgroup's memory limit when lower (containers).
int64_t host_memory() {
  int64_t pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  int64_t total = pages > 0 && page > 0 ? pages * page : 0;
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string v;
    if (in >> v && !v.empty() && v != "max") {
      std::optional<int64_t> n = parse_byte_size(v);
      if (n && *n > 0 && (total == 0 || *n < total)) total = *n;
    }
  }
  return total;
}

int64_t host_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace

Buffer::Buffer(const PJRT_Api* api, PJRT_Buffer* buffer, int device_index, int64_t bytes, bool tracked,
               bool counted)
    : api_(api), buffer_(buffer), tracked_(tracked), device_index_(device_index), bytes_(bytes) {
  if (tracked_ && !counted) account(device_index_, bytes_, true);
}

void account_buffers(int device, int64_t bytes, int64_t count, bool created) {
  if (count > 0) account(device, bytes, created, count);
}

Buffer::~Buffer() {
  if (in_forked_child()) return;  // the parent's plugin state: leave it
  if (!donated_ && tracked_) account(device_index_, bytes_, false);
  PJRT_Buffer* b = buffer_.load(std::memory_order_acquire);
  if (!b) return;  // its launch failed: never made
  auto args = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = b;
  discard(api_, api_->PJRT_Buffer_Destroy(&args));
}

void Buffer::mark_donated(bool count) {
  if (donated_) return;
  if (tracked_ && count) account(device_index_, bytes_, false);  // the buffer is gone (it lives on as the output)
  bytes_ = 0;
  donated_ = true;
}

int64_t live_bytes(int device) { return device >= 0 && device < kMaxDevices ? g_live[device].load() : 0; }

void Runtime::reset_peak(int device) {
  check_device(device);
  g_peak[device] = g_live[device].load();
  g_count_peak[device] = g_count[device].load();
}

AllocationCounters allocation_counters(int device) {
  AllocationCounters c;
  if (device < 0 || device >= kMaxDevices) return c;
  c.bytes_current = g_live[device].load();
  c.bytes_peak = g_peak[device].load();
  c.bytes_allocated = g_bytes_allocated[device].load();
  c.bytes_freed = g_bytes_freed[device].load();
  c.count_current = g_count[device].load();
  c.count_peak = g_count_peak[device].load();
  c.count_allocated = g_count_allocated[device].load();
  c.count_freed = g_count_freed[device].load();
  return c;
}

void reset_accumulated(int device) {
  if (device < 0 || device >= kMaxDevices) return;
  g_bytes_allocated[device] = 0;
  g_bytes_freed[device] = 0;
  g_count_allocated[device] = 0;
  g_count_freed[device] = 0;
}

void Runtime::read_plugin_memory(int device, MemoryStats* stats) {
  auto args = PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  args.device = devices_[device];
  if (PJRT_Error* err = api_->PJRT_Device_MemoryStats(&args)) {
    discard(api_, err);  // UNIMPLEMENTED on the CPU plugin
    return;
  }
  stats->plugin_reports = true;
  stats->plugin_bytes_in_use = args.bytes_in_use;
  if (args.peak_bytes_in_use_is_set) stats->plugin_peak_bytes_in_use = args.peak_bytes_in_use;
  if (args.bytes_limit_is_set) stats->plugin_bytes_limit = args.bytes_limit;
  if (args.bytes_reserved_is_set) stats->plugin_bytes_reserved = args.bytes_reserved;
}

int64_t Runtime::query_total_memory(int device) {
  MemoryStats s;
  read_plugin_memory(device, &s);
  if (s.plugin_bytes_limit > 0) return s.plugin_bytes_limit;
  return info_.platform == "cpu" ? host_memory() : 0;
}

int64_t Runtime::total_memory(int device) const {
  check_device(device);
  return totals_[device];
}

int64_t Runtime::memory_limit(int device) const {
  check_device(device);
  return limits_[device].load();
}

void Runtime::set_memory_limit(int device, int64_t bytes) {
  check_device(device);
  limits_[device].store(bytes < 0 ? 0 : bytes);
}

MemoryStats Runtime::memory_stats(int device) {
  check_device(device);
  await_launches();  // buffers the launch thread still has to let go of
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    retire_ready_locked(device);  // finished work no longer holds its buffers
  }
  MemoryStats s;
  read_plugin_memory(device, &s);
  s.allocated = g_live[device].load();
  s.peak = g_peak[device].load();
  s.held_by_queue = held_by_queue(device);
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    s.queued_executions = static_cast<int64_t>(pending_[device].size());
  }
  s.total = totals_[device];
  s.limit = limits_[device].load() > 0 ? limits_[device].load() : s.total;
  return s;
}

std::pair<int64_t, int64_t> Runtime::mem_get_info(int device) {
  MemoryStats s = memory_stats(device);
  int64_t total = limits_[device].load() > 0 ? limits_[device].load() : s.total;
  int64_t free;
  if (limits_[device] > 0) free = total - s.allocated;
  else if (s.plugin_reports && s.plugin_bytes_limit > 0) free = s.plugin_bytes_limit - s.plugin_bytes_in_use;
  else if (info_.platform == "cpu") free = std::min(host_available(), total);
  else free = total - s.allocated;
  return {free < 0 ? 0 : free, total};
}

void Runtime::ensure_fits(int device, int64_t bytes, const char* what) {
  // Without a limit the device's own size still bounds a request (a CPU
  // plugin would otherwise die in the allocator, a GPU fail asynchronously).
  int64_t limit = limits_[device].load() > 0 ? limits_[device].load() : totals_[device];
  if (limit <= 0 || g_live[device].load() + bytes <= limit) return;
  metrics().memory_drains++;
  drain(device);  // buffers held only by finished queued work go away
  int64_t in_use = g_live[device].load();
  if (in_use + bytes <= limit) return;
  metrics().out_of_memory_errors++;
  const std::string* op = OpLabel::current();
  int64_t queued = held_by_queue(device);
  std::string msg = "torch_pjrt: tpu:" + std::to_string(device) + " is out of memory: " + what +
                    (op ? " of " + *op : std::string()) + " tried to allocate " + format_bytes(bytes) + "; " +
                    format_bytes(in_use) + " already in use";
  if (queued > 0) msg += " (" + format_bytes(queued) + " of it held by queued work)";
  msg += ", limit " + format_bytes(limit) +
         (limits_[device] > 0 ? " (TORCH_PJRT_MEMORY_LIMIT / set_per_process_memory_fraction)"
                              : " (the device's memory)") +
         ". Free tensors you no longer need, or use smaller batches.";
  raise(ErrorKind::OutOfMemory, msg);
}

}  // namespace torch_pjrt::runtime
