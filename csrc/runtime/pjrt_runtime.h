// The runtime layer: one PJRT plugin, one client, its devices, buffers,
// compiled executables. It knows nothing of PyTorch; the device glue and the
// eager frontend sit on top of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "persistent_cache.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::runtime {

// Counters exported to Python as torch_pjrt.metrics().
struct Metrics {
  std::atomic<int64_t> xla_compiles{0};
  std::atomic<int64_t> executable_cache_hits{0};
  std::atomic<int64_t> executable_cache_misses{0};
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> device_to_device_bytes{0};
  std::atomic<double> compile_seconds{0.0};
  std::atomic<int64_t> host_waits{0};  // times the host blocked on the device
  // Persistent executable cache (persistent_cache.h): executables loaded from
  // disk instead of compiled, programs not found there, entries written, bad
  // entries found (truncated, corrupted, foreign, undeserializable), the time
  // spent reading and loading hits, and the time spent serializing and writing.
  std::atomic<int64_t> persistent_cache_hits{0};
  std::atomic<int64_t> persistent_cache_misses{0};
  std::atomic<int64_t> persistent_cache_writes{0};
  std::atomic<int64_t> persistent_cache_errors{0};
  std::atomic<double> persistent_cache_load_seconds{0.0};
  std::atomic<double> persistent_cache_save_seconds{0.0};
};
Metrics& metrics();

// Owns one PJRT_Buffer; destroyed when the last reference goes.
class Buffer {
 public:
  Buffer(const PJRT_Api* api, PJRT_Buffer* buffer, int device_index)
      : api_(api), buffer_(buffer), device_index_(device_index) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  PJRT_Buffer* get() const { return buffer_; }
  int device_index() const { return device_index_; }

 private:
  const PJRT_Api* api_;
  PJRT_Buffer* buffer_;
  int device_index_;
};
using BufferPtr = std::shared_ptr<Buffer>;

class Executable {
 public:
  Executable(const PJRT_Api* api, PJRT_LoadedExecutable* exe, size_t num_outputs)
      : api_(api), exe_(exe), num_outputs_(num_outputs) {}
  ~Executable();
  PJRT_LoadedExecutable* get() const { return exe_; }
  size_t num_outputs() const { return num_outputs_; }

 private:
  const PJRT_Api* api_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_;
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

class Runtime {
 public:
  // Loads the plugin, checks its API version, creates the client. Throws
  // std::runtime_error naming the plugin when anything fails.
  static void initialize(const std::string& plugin_path, const std::string& name,
                         int64_t cpu_device_count);
  static bool initialized();
  static Runtime& get();

  const PluginInfo& info() const { return info_; }
  const PJRT_Api* api() const { return api_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  std::string device_kind(int index) const;
  void check_device(int index) const;

  BufferPtr buffer_from_host(const void* data, PJRT_Buffer_Type type,
                             const std::vector<int64_t>& dims, int device);
  // Blocks until the bytes are in `dst`.
  void buffer_to_host(const Buffer& buffer, void* dst, size_t nbytes);
  BufferPtr copy_to_device(const Buffer& buffer, int device, size_t nbytes);
  // Loads the program from the persistent cache, or compiles it with XLA
  // (xla_compiles) and saves it there.
  ExecutablePtr compile(const std::string& mlir_text);
  // The persistent executable cache; disabled() when TORCH_PJRT_CACHE_DIR="".
  PersistentCache& persistent_cache() const { return *cache_; }
  // Asynchronous: returns the outputs at once; they become ready later.
  std::vector<BufferPtr> execute(const Executable& exe,
                                 const std::vector<PJRT_Buffer*>& args, int device);
  // Waits for every execution launched so far on `device` (-1: all devices).
  void synchronize(int device);

  // Turns a PJRT error into std::runtime_error carrying the plugin's message.
  void check(PJRT_Error* error, const char* what) const;

 private:
  Runtime() = default;
  void await_and_destroy(PJRT_Event* event, const char* what);
  void prune_pending_locked();
  ExecutablePtr wrap(PJRT_LoadedExecutable* loaded);
  ExecutablePtr load_cached(const std::string& mlir_text, const Sha256::Digest& key);
  void save_to_cache(PJRT_LoadedExecutable* loaded, const std::string& mlir_text,
                     const Sha256::Digest& key);
  std::string cache_identity() const;

  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  PluginInfo info_;
  std::unique_ptr<PersistentCache> cache_;
  std::mutex pending_mutex_;
  std::vector<std::pair<int, PJRT_Event*>> pending_;  // (device, completion)
};

size_t element_size(PJRT_Buffer_Type type);

}  // namespace torch_pjrt::runtime
