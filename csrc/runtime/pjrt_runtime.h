// The runtime layer: one PJRT plugin, one client, its devices, buffers,
// compiled executables. It knows nothing of PyTorch; the device glue and the
// eager frontend sit on top of it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "errors.h"
#include "kv_store.h"
#include "persistent_cache.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::runtime {

// Counters exported to Python as torch_pjrt.metrics().
struct Metrics {
  std::atomic<int64_t> xla_compiles{0};
  std::atomic<int64_t> executable_cache_hits{0};
  std::atomic<int64_t> executable_cache_misses{0};
  std::atomic<int64_t> executions{0};
  // Host time spent inside the plugin's execute call (launching, not running).
  std::atomic<double> execute_call_seconds{0.0};
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> host_reads_in_place{0};  // reads copied from host memory (Runtime::read_in_place)
  std::atomic<int64_t> device_to_device_bytes{0};
  std::atomic<double> compile_seconds{0.0};
  // Programs handed to the compile threads (compile_pool.cpp), and those that
  // found the same program already compiling there.
  std::atomic<int64_t> thread_compiles{0};
  std::atomic<int64_t> thread_compiles_joined{0};
  std::atomic<int64_t> host_waits{0};  // times the host blocked on the device
  // Persistent executable cache (persistent_cache.h): executables loaded from
  // disk instead of compiled, programs not found there, entries written, bad
  // entries found (truncated, corrupted, foreign, undeserializable), the time
  // spent reading and loading hits, and the time spent serializing and writing.
  std::atomic<int64_t> persistent_cache_hits{0};
  std::atomic<int64_t> persistent_cache_misses{0};
  std::atomic<int64_t> persistent_cache_writes{0};
  std::atomic<int64_t> persistent_cache_scans{0};  // directory scans for the size cap
  std::atomic<int64_t> persistent_cache_errors{0};
  std::atomic<double> persistent_cache_load_seconds{0.0};
  std::atomic<double> persistent_cache_save_seconds{0.0};
  // Times a launch waited because its device had max_inflight executions
  // queued (backpressure), and because the memory limit was reached and the
  // queue was drained to free what queued work held.
  std::atomic<int64_t> queue_full_waits{0};
  std::atomic<int64_t> memory_drains{0};
  std::atomic<int64_t> out_of_memory_errors{0};
  std::atomic<int64_t> device_check_failures{0};  // value checks (indices, ...) reported
  // Executions handed to the launch thread (Runtime::launch), and times a
  // caller had to wait for one to be launched (reading a pending buffer,
  // synchronize, a donation decision).
  std::atomic<int64_t> async_launches{0};
  std::atomic<int64_t> launch_waits{0};
  std::atomic<int64_t> caller_launches{0};  // queued launches a waiting caller made itself
};
Metrics& metrics();

// Owns one PJRT_Buffer; destroyed when the last reference goes. Its bytes
// (element size x elements) count in its device's memory_allocated from
// creation to destruction. An output of an execution queued on the launch
// thread (Runtime::launch) is pending until that execution is launched:
// get() waits for it, and raises the launch's error if it failed.
class Buffer {
 public:
  // `tracked`: counted in the device's memory figures (memory_allocated, the
  // limit); internal constants (constant_buffers.h) are not. A null `buffer`
  // makes a pending one (launcher.cpp fills it).
  // `counted`: the caller already counted its bytes (account_buffers, for
  // many at once).
  Buffer(const PJRT_Api* api, PJRT_Buffer* buffer, int device_index, int64_t bytes, bool tracked = true,
         bool counted = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  PJRT_Buffer* get() const {
    PJRT_Buffer* b = buffer_.load(std::memory_order_acquire);
    return b ? b : await_launch();
  }
  int device_index() const { return device_index_; }
  int64_t bytes() const { return bytes_; }
  // Given to an execution as an aliased (donated) input: its memory now
  // belongs to that execution's output, so it no longer counts here.
  void mark_donated(bool count = true);  // count false: the caller counts it (account_buffers)
  bool donated() const { return donated_; }

 private:
  friend class Runtime;
  friend class QueueHold;
  PJRT_Buffer* await_launch() const;  // launcher.cpp
  const PJRT_Api* api_;
  std::atomic<PJRT_Buffer*> buffer_;
  std::exception_ptr failed_;  // its launch's error (set under the launcher's lock)
  bool donated_ = false;
  // References held by executions (QueueHold), queued on the launch thread
  // or launched (running or done, not yet retired). They do not stop a later
  // execution from donating the buffer: PJRT orders a donation after the
  // buffer's earlier uses, and the launch thread keeps queue order.
  std::atomic<int32_t> queue_refs_{0};
  bool tracked_;
  int device_index_;
  int64_t bytes_;
};
using BufferPtr = std::shared_ptr<Buffer>;

// What an execution holds (its arguments and outputs) while queued on the
// launch thread or launched, counted on each buffer so that donation
// decisions can tell these references from an owner's
// (Runtime::choose_donations). Made on the thread that launches (which also
// decides donations); the launch thread only moves it from the queued job to
// the launched execution. A count goes down before its reference does, so a
// concurrent reader can only see too few counted references, never too many.
class QueueHold {
 public:
  QueueHold() = default;
  explicit QueueHold(std::vector<BufferPtr> buffers);
  QueueHold(QueueHold&& o) noexcept : buffers_(std::move(o.buffers_)) { o.buffers_.clear(); }
  QueueHold& operator=(QueueHold&& o) noexcept;
  ~QueueHold() { release(); }
  const std::vector<BufferPtr>& buffers() const { return buffers_; }
  void release();

 private:
  std::vector<BufferPtr> buffers_;
};

class Executable {
 public:
  Executable(const PJRT_Api* api, PJRT_LoadedExecutable* exe, std::vector<int64_t> output_bytes,
             int64_t code_bytes);
  // A program still compiling (Runtime::compile_async), its output sizes
  // known ahead: get() waits for the compile and raises its error.
  Executable(std::vector<int64_t> output_bytes, std::shared_future<std::shared_ptr<Executable>> compiled);
  ~Executable();
  PJRT_LoadedExecutable* get() const { return compiled_.valid() ? compiled_.get()->get() : exe_; }
  // Waits for a compile in flight (its error is left for get()).
  void wait() const {
    if (compiled_.valid()) compiled_.wait();
  }
  // Whether get() would not wait (a compile in flight has ended, well or not).
  bool ready() const {
    return !compiled_.valid() || compiled_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  // The program a compile in flight made (waits; raises its error); null for
  // a program compiled already.
  std::shared_ptr<Executable> compiled() const { return compiled_.valid() ? compiled_.get() : nullptr; }
  // Seconds the compile (or persistent-cache load) took on a compile thread
  // (Runtime::compile_async sets it on the program it made).
  double thread_compile_seconds = 0;
  size_t num_outputs() const { return output_bytes_.size(); }
  int64_t output_bytes(size_t i) const { return output_bytes_[i]; }
  int64_t total_output_bytes() const { return total_output_bytes_; }
  // Generated code as the plugin reports it (0 when it reports none, or
  // while the program compiles).
  int64_t code_bytes() const;

 private:
  const PJRT_Api* api_ = nullptr;
  PJRT_LoadedExecutable* exe_ = nullptr;
  std::shared_future<std::shared_ptr<Executable>> compiled_;
  std::vector<int64_t> output_bytes_;
  int64_t total_output_bytes_ = 0;
  int64_t code_bytes_;
};
using ExecutablePtr = std::shared_ptr<Executable>;

struct PluginInfo {
  std::string name;      // "cpu", "cuda", "tpu" or the file's stem
  std::string path;      // the shared object that was loaded
  std::string platform;  // the client's platform name, e.g. "cpu"
  std::string platform_version;
  int api_major = 0;
  int api_minor = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
};

// Plugin names resolve to these relative paths under each search root.
std::vector<std::string> known_plugin_files(const std::string& name);
// Installed plugins found under `roots` (site-packages directories), as
// (name, path) pairs, in the default preference order tpu, cuda, cpu.
std::vector<std::pair<std::string, std::string>> discover_plugins(
    const std::vector<std::string>& roots);
// A name ("cpu", "cuda", "tpu") or a path to a plugin shared object.
std::string resolve_plugin(const std::string& name_or_path,
                           const std::vector<std::string>& roots);

// Device memory figures (memory_stats()). `allocated` is every live buffer:
// tensors' storages and buffers only queued work still holds.
struct MemoryStats {
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t held_by_queue = 0;  // part of `allocated` no tensor owns any more
  int64_t queued_executions = 0;
  int64_t limit = 0;          // the effective limit (0: none)
  int64_t total = 0;          // the device's memory (plugin figure, else host RAM for CPU; 0: unknown)
  // The plugin's own figures, when it reports them (PJRT_Device_MemoryStats).
  bool plugin_reports = false;
  int64_t plugin_bytes_in_use = 0;
  int64_t plugin_peak_bytes_in_use = 0;
  int64_t plugin_bytes_limit = 0;
  int64_t plugin_bytes_reserved = 0;
};

// Allocation counters of a device's buffers (DeviceAllocator statistics):
// bytes and buffer counts now, at the peak, created and destroyed since the
// last reset_accumulated.
struct AllocationCounters {
  int64_t bytes_current = 0, bytes_peak = 0, bytes_allocated = 0, bytes_freed = 0;
  int64_t count_current = 0, count_peak = 0, count_allocated = 0, count_freed = 0;
};
AllocationCounters allocation_counters(int device);
void reset_accumulated(int device);

// A marker in a device's execution queue (torch.tpu.Event, torch.Event): it
// completes when every execution launched on the device before it was
// recorded has completed, and its time is taken then (steady clock, in the
// plugin's completion callback of the last of them), so two events measure
// device time, not the host's launch time. Recorded with nothing in flight,
// it is complete at once, timed at the recording.
class DeviceEvent {
 public:
  explicit DeviceEvent(int device) : device_(device) {}
  int device() const { return device_; }
  bool ready() const;
  void wait() const;
  // steady_clock nanoseconds of completion (valid once ready()).
  int64_t time_ns() const;
  // One awaited execution completed at `now_ns` (the runtime's callbacks).
  void arrive(int64_t now_ns);

 private:
  friend class Runtime;
  int device_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  int remaining_ = 0;
  int64_t time_ns_ = 0;
  int64_t serial_ = 0;  // executions launched on the device when recorded
};
using DeviceEventPtr = std::shared_ptr<DeviceEvent>;

// Set in a child made by fork(): the parent's PJRT client (its threads, its
// device state) does not exist there, so nothing may call into the plugin.
bool in_forked_child();

// Whether Runtime::launch uses the launch thread (TORCH_PJRT_ASYNC_LAUNCH=0:
// it calls execute() on the caller's thread instead).
bool async_launch_enabled();
void set_async_launch(bool on);

class Runtime {
 public:
  // Loads the plugin, checks its API version, creates the client. Throws
  // std::runtime_error naming the plugin when anything fails.
  static void initialize(const std::string& plugin_path, const std::string& name,
                         int64_t cpu_device_count);
  static bool initialized();
  // Raises RuntimeError in a forked child (see in_forked_child()).
  static Runtime& get();
  // The runtime even in a forked child (device counts only); null before init.
  static Runtime* get_unchecked();

  const PluginInfo& info() const { return info_; }
  const PJRT_Api* api() const { return api_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  std::string device_kind(int index) const;
  void check_device(int index) const;

  // `tracked`: see Buffer (false for internal constants only).
  BufferPtr buffer_from_host(const void* data, PJRT_Buffer_Type type,
                             const std::vector<int64_t>& dims, int device, bool tracked = true);
  // Blocks until the bytes are in `dst`.
  void buffer_to_host(const Buffer& buffer, void* dst, size_t nbytes);
  BufferPtr copy_to_device(const Buffer& buffer, int device, size_t nbytes);
  // Loads the program from the persistent cache, or compiles it with XLA
  // (xla_compiles) and saves it there.
  ExecutablePtr compile(const std::string& mlir_text);
  // The same on a compile thread (compile_pool.cpp): returns at once an
  // executable whose get() waits for it, so that the ops after it (and
  // their compiles, on other threads) go on meanwhile. `output_bytes`: the
  // program's output sizes, which launches count before it has compiled
  // (empty: not known, not checked; only compiled() is then of use);
  // `what`: the op, named in a compile error.
  ExecutablePtr compile_async(std::string mlir_text, std::vector<int64_t> output_bytes, std::string what);
  // TORCH_PJRT_COMPILE_THREADS, read once (a bad value raises).
  static int compile_threads();
  // Waits until no compile is queued or running on the compile threads.
  // torch_pjrt calls it at interpreter exit (Python's atexit): exit's own
  // handlers run XLA's static destructors, which a compile still running
  // (a fused trace's can take seconds) would crash in.
  static void wait_for_compiles();
  // The persistent executable cache; disabled() when TORCH_PJRT_CACHE_DIR="".
  PersistentCache& persistent_cache() const { return *cache_; }
  // Whether small programs compile with their own options (plugin_flags.h).
  bool small_programs_apart() const { return !small_program_options_.empty(); }
  // Asynchronous: returns the outputs at once; they become ready later. The
  // arguments and outputs stay alive (and counted) until the execution is
  // seen complete. Waits first when `device` has max_inflight() executions
  // queued, and raises OutOfMemory when the outputs do not fit the limit
  // even after the queue drained.
  // Inputs the program aliases to outputs (tf.aliasing_output) are donated
  // unless listed in `not_donated` (another owner still reads them); those in
  // `donated` are marked so (Buffer::mark_donated) once the launch succeeds.
  std::vector<BufferPtr> execute(const Executable& exe, const std::vector<BufferPtr>& args, int device,
                                 const std::vector<int64_t>& donated = {},
                                 const std::vector<int64_t>& not_donated = {});
  // Waits for every execution launched so far on `device` (-1: all devices),
  // then reports failed value checks (report_checks).
  void synchronize(int device);
  // execute() with the plugin's execute call made on the launch thread
  // (launcher.cpp): the outputs come back at once, pending until launched,
  // and executions run in the order they were queued. Memory is checked and
  // donated inputs are marked here, as execute() does; a launch that fails
  // fails its outputs' reads and the next synchronize.
  std::vector<BufferPtr> launch(const ExecutablePtr& exe, std::vector<BufferPtr> args, int device,
                                std::vector<int64_t> donated = {}, std::vector<int64_t> not_donated = {});
  // Waits until everything queued by launch() has been launched (not run).
  void await_launches();
  // Drops these references on the launch thread, after what is queued there
  // (destroying a buffer is a plugin call); at once when it is not running.
  void release_later(std::vector<BufferPtr> buffers);
  // An event completing with the work launched so far on `device` (DeviceEvent).
  DeviceEventPtr record_event(int device);
  // Whether every execution launched so far on `device` has completed.
  bool idle(int device);
  // Executions launched on `device` up to this count are known complete (a
  // synchronize or drain awaited them); completion callbacks may come later.
  int64_t awaited(int device) const { return awaited_[device].load(); }
  // Lets go at once of what finished executions still hold (empty_cache);
  // -1: all devices. Never waits.
  void release_finished(int device);
  // Of `candidates` (indices into `args`, inputs a program may overwrite),
  // those whose only references are `args`' own and executions' (QueueHold)
  // go to `donated`, the rest to `kept`. A program not `queued` on the launch
  // thread would run ahead of what is queued there, so where a candidate is
  // held by an execution, the queue is launched first. Finished executions
  // let go first. Never waits for the device.
  void choose_donations(const std::vector<BufferPtr>& args, const std::vector<int64_t>& candidates, int device,
                        bool queued, std::vector<int64_t>& donated, std::vector<int64_t>& kept);

  // ---- memory ----
  MemoryStats memory_stats(int device);
  void reset_peak(int device);
  // Bytes the device may hold (0: no limit): TORCH_PJRT_MEMORY_LIMIT (bytes
  // or a fraction of the device's memory) or set_memory_limit.
  int64_t memory_limit(int device) const;
  void set_memory_limit(int device, int64_t bytes);
  // The device's memory: the plugin's bytes_limit, else host RAM for the CPU
  // plugin; 0 when unknown.
  int64_t total_memory(int device) const;
  // (free, total) as torch.cuda.mem_get_info.
  std::pair<int64_t, int64_t> mem_get_info(int device);
  // Raises OutOfMemory when `bytes` more do not fit the device's limit (after
  // draining the queue, which frees what finished work held).
  void ensure_fits(int device, int64_t bytes, const char* what);
  int max_inflight() const { return max_inflight_.load(); }
  void set_max_inflight(int n) { max_inflight_.store(n < 1 ? 1 : n); }

  // ---- value checks (index ranges, integer division by zero) ----
  // A checked program takes its device's check word (an s32 0-d buffer, 0 =
  // nothing failed) and returns it, set to the code of its first failing
  // check. Host reads and synchronize report a set word as the error
  // registered for the code.
  int register_check(ErrorKind kind, const std::string& message);
  BufferPtr check_word(int device);
  void set_check_word(int device, BufferPtr word);
  // Raises the first failed check on `device` (-1: all), once, and resets
  // the word. `at_op`: right after the op (debug mode), not at a later read.
  // `reading`: for a host read, which skips a word deferred by defer_checks.
  void report_checks(int device, bool at_op = false, bool reading = false);
  // The current word's checks are not waited for by the next host read (they
  // are reported at the read after it, or at synchronize): the word of work
  // launched at a read whose value does not depend on it (fused eager's
  // pipelined flushes).
  void defer_checks(int device);
  // Drops the current word's failures unread (a fresh zero word next time):
  // work whose failures strict eager's one word would have folded into a
  // failure already reported.
  void discard_checks(int device);

  // Turns a PJRT error into std::runtime_error carrying the plugin's message.
  void check(PJRT_Error* error, const char* what) const;

  // ---- programs over several devices, distributed clients (multi_device.cpp) ----
  struct GlobalDevice {
    int64_t id = 0;     // the plugin's global device id
    int process = 0;    // the process that can address it
    int local = -1;     // its index among this process's devices; -1: another process's
  };
  // Every device of the client, this process's and (distributed) the others'.
  std::vector<GlobalDevice> global_devices() const;
  int64_t global_id(int device) const;
  // Compiles `mlir_text` (a module with mhlo.num_replicas = ids.size()) to
  // run replica r on the device whose global id is ids[r]. Not kept in the
  // persistent cache (collective programs are small and keyed by devices).
  ExecutablePtr compile_replicated(const std::string& mlir_text, const std::vector<int64_t>& ids);
  // Launches a replicated program on each of its devices in this process:
  // `args[i]` are the arguments on local device `devices[i]`; returns each
  // one's outputs in the same order. Asynchronous, queued like execute().
  std::vector<std::vector<BufferPtr>> execute_replicated(const Executable& exe, const std::vector<int>& devices,
                                                         const std::vector<std::vector<BufferPtr>>& args);
  // Makes the client one node of `num_nodes` (this one `node_id`) that find
  // each other through `kv`: the client is created again with the plugin's
  // distributed options. Only before anything was allocated, compiled or run
  // (the old client's buffers and programs would be lost); throws
  // std::runtime_error saying what was already done otherwise.
  void make_distributed(int node_id, int num_nodes, KeyValueStorePtr kv);
  // (node_id, num_nodes) of a distributed client; (0, 1) otherwise.
  std::pair<int, int> node() const { return {node_id_, num_nodes_}; }

 private:
  Runtime() = default;
  struct Pending {
    PJRT_Event* event;
    QueueHold held;  // arguments and outputs of the execution
  };
  void await_and_destroy(PJRT_Event* event, const char* what);
  void spin_until_ready(PJRT_Event* event);
  // Copies a flat buffer that lives in host memory (the CPU plugin's) once
  // it is ready; false (nothing read) for any other buffer.
  bool read_in_place(PJRT_Buffer* buffer, void* dst, size_t nbytes);
  // `nbytes` of `buffer` into `dst`, once it is ready: in place where it can
  // (read_in_place), else the plugin's transfer. `what` names it in errors.
  void read_to_host(PJRT_Buffer* buffer, void* dst, size_t nbytes, const char* what);
  // Destroys the event; its error (if any) surfaces again when outputs are read.
  void retire(Pending& p, bool wait);
  void retire_ready_locked(int device);
  void drain(int device);
  // The queues of `device` (-1: all), with each one's launch count: once
  // they are awaited, mark_awaited(counts) says so.
  std::vector<std::deque<Pending>> take_pending(int device, std::vector<std::pair<int, int64_t>>* counts = nullptr);
  void mark_awaited(const std::vector<std::pair<int, int64_t>>& counts);
  int64_t held_by_queue(int device);
  void read_plugin_memory(int device, MemoryStats* stats);
  int64_t query_total_memory(int device);
  [[noreturn]] void raise_plugin_error(PJRT_Error* error, const char* what) const;
  ExecutablePtr wrap(PJRT_LoadedExecutable* loaded);
  ExecutablePtr load_cached(const std::string& mlir_text, const Sha256::Digest& key);
 public:
  // The persistent cache's executable for `key` (a program of `program_size`
  // bytes of text), loaded onto this client; null on a miss or a bad entry.
  ExecutablePtr load_by_key(const Sha256::Digest& key, size_t program_size);

 private:
  void save_to_cache(PJRT_LoadedExecutable* loaded, const std::string& mlir_text,
                     const Sha256::Digest& key);
  void create_client(KeyValueStore* kv, int node_id, int num_nodes);
  // PJRT_Client_Compile with serialized compile options (counted, timed).
  PJRT_LoadedExecutable* compile_with(const std::string& mlir_text, const std::string& options, const char* what);
  // Raises OutOfMemoryError unless the outputs of `exe` fit, counting the
  // memory of the `donated` arguments as reused.
  void ensure_outputs_fit(const Executable& exe, const std::vector<BufferPtr>& args,
                          const std::vector<int64_t>& donated, int device);
  // Queues a launched execution's completion event and what it holds.
  void enqueue(int device, PJRT_Event* done, QueueHold held);
  // The plugin's execute call and the queueing of its event; `donated`
  // marked once it succeeded (null: marked already, by launch()); the
  // outputs are made and returned, or fill `pending` (a launch, whose
  // `hold` of its arguments and outputs the queued execution takes over).
  std::vector<BufferPtr> execute_call(const Executable& exe, std::span<const BufferPtr> args, int device,
                                      const std::vector<int64_t>* donated, const std::vector<int64_t>& not_donated,
                                      std::span<const BufferPtr> pending = {}, QueueHold* hold = nullptr);
  void launch_loop();
  friend class Buffer;  // (a reader of a pending buffer may launch it: Buffer::await_launch)
  void run_front_job(std::unique_lock<std::mutex>& lock);
  // The first failed launch since the last synchronize (raised there).
  std::exception_ptr take_launch_error();
  std::string cache_identity() const;

  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  int64_t cpu_device_count_ = 0;
  // Compile options for small programs (runtime/plugin_flags.h); empty: none.
  std::string small_program_options_;
  KeyValueStorePtr kv_;  // a distributed client's store (outlives the client)
  int node_id_ = 0, num_nodes_ = 1;
  std::vector<PJRT_Device*> devices_;
  PluginInfo info_;
  std::unique_ptr<PersistentCache> cache_;
  std::mutex pending_mutex_;
  std::vector<std::deque<Pending>> pending_;  // per device, oldest first
  std::vector<int64_t> launched_;             // per device, under pending_mutex_
  std::unique_ptr<std::atomic<int64_t>[]> awaited_;
  std::atomic<int> max_inflight_{64};
  std::unique_ptr<std::atomic<int64_t>[]> limits_;  // per device, 0: none
  std::vector<int64_t> totals_;  // per device, 0: unknown
  std::mutex check_mutex_;
  std::vector<BufferPtr> check_words_;  // per device; null: never checked
  std::vector<bool> check_deferred_;    // defer_checks: the next host read skips the word
  std::vector<bool> check_dirty_;       // a checked program ran since the last report
  std::vector<std::pair<ErrorKind, std::string>> checks_;  // code - 1 -> error
};

// Live buffer bytes of `device` (and the peak), kept by Buffer.
int64_t live_bytes(int device);
// `count` tracked buffers of `bytes` in all made (or gone, `created` false)
// on `device`, counted at once: a launch's outputs and donated inputs.
void account_buffers(int device, int64_t bytes, int64_t count, bool created);

size_t element_size(PJRT_Buffer_Type type);

}  // namespace torch_pjrt::runtime
