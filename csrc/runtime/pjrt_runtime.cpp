// Client, buffers, compile and execute over the PJRT C API.
#include "pjrt_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "runtime/byte_size.h"
#include "runtime/plugin_flags.h"
#include "runtime/prefetch.h"
#include "runtime/program_cache.h"
#include "runtime/sha256.h"
#include "runtime/pjrt_util.h"

namespace torch_pjrt::runtime {
namespace {

// The oldest PJRT C API minor version whose struct layouts we rely on.
constexpr int kMinApiMinor = 40;
// How long a host read polls before it sleeps (Runtime::spin_until_ready).
constexpr int kReadSpinMicros = 200;

// Never destroyed: at process exit tensors, cached executables and PyTorch's
// autograd device threads may still hold PJRT objects, and tearing the client
// down under them aborts ("terminate called without an active exception").
std::unique_ptr<Runtime>& instance() {
  static auto* rt = new std::unique_ptr<Runtime>();
  return *rt;
}

// Serialized xla.CompileOptionsProto: executable_build_options (field 3) with
// num_replicas = 1 (field 4) and num_partitions = 1 (field 5), then
// compile_portable_executable = true (field 4) so one executable runs on any
// device chosen at execute time.
const char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
const std::string kCompileOptionsBytes(kCompileOptions, sizeof(kCompileOptions));

// The host CPU as far as compiled code cares: model and instruction-set
// flags (XLA's CPU backend compiles for the host it runs on).
std::string host_cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    auto value = [&] {
      size_t colon = line.find(':');
      return colon == std::string::npos ? std::string() : line.substr(colon + 1);
    };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags.empty() && (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0))
      flags = value();
  }
  size_t start = model.find_first_not_of(" \t");
  model = start == std::string::npos ? "" : model.substr(start);
  return model + "; flags sha256 " + Sha256::hex(Sha256::of(flags)).substr(0, 16);
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

Metrics& metrics() {
  static Metrics m;
  return m;
}

size_t element_size(PJRT_Buffer_Type type) {
  switch (type) {
    case PJRT_Buffer_Type_PRED:
    case PJRT_Buffer_Type_S8:
    case PJRT_Buffer_Type_U8:
    case PJRT_Buffer_Type_F8E4M3FN:
    case PJRT_Buffer_Type_F8E5M2:
    case PJRT_Buffer_Type_F8E4M3FNUZ:
    case PJRT_Buffer_Type_F8E5M2FNUZ:
      return 1;
    case PJRT_Buffer_Type_S16:
    case PJRT_Buffer_Type_U16:
    case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32:
    case PJRT_Buffer_Type_U32:
    case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64:
    case PJRT_Buffer_Type_U64:
    case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default:
      throw std::runtime_error("torch_pjrt: unsupported PJRT buffer type " +
                               std::to_string(static_cast<int>(type)));
  }
}

Executable::Executable(const PJRT_Api* api, PJRT_LoadedExecutable* exe, std::vector<int64_t> output_bytes,
                       int64_t code_bytes)
    : api_(api), exe_(exe), output_bytes_(std::move(output_bytes)), code_bytes_(code_bytes) {
  for (int64_t b : output_bytes_) total_output_bytes_ += b;
}

Executable::Executable(std::vector<int64_t> output_bytes, std::shared_future<std::shared_ptr<Executable>> compiled)
    : compiled_(std::move(compiled)), output_bytes_(std::move(output_bytes)), code_bytes_(0) {
  for (int64_t b : output_bytes_) total_output_bytes_ += b;
}

int64_t Executable::code_bytes() const {
  if (!compiled_.valid()) return code_bytes_;
  if (compiled_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return 0;
  try {
    return compiled_.get()->code_bytes();
  } catch (...) {
    return 0;  // (a failed compile: raised where the program is run)
  }
}

Executable::~Executable() {
  if (!exe_ || in_forked_child()) return;  // (none of its own; or the parent's plugin state: leave it)
  auto args = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = exe_;
  discard(api_, api_->PJRT_LoadedExecutable_Destroy(&args));
}

void Runtime::raise_plugin_error(PJRT_Error* error, const char* what) const {
  bool oom = error_code(api_, error) == PJRT_Error_Code_RESOURCE_EXHAUSTED;
  std::string msg = "torch_pjrt: " + std::string(what) + " failed in PJRT plugin '" + info_.name +
                    "': " + take_message(api_, error);
  if (oom) {
    metrics().out_of_memory_errors++;
    if (const std::string* op = OpLabel::current()) msg += " (while running " + *op + ")";
  }
  raise(oom ? ErrorKind::OutOfMemory : ErrorKind::Runtime, msg);
}

void Runtime::check(PJRT_Error* error, const char* what) const {
  if (error) raise_plugin_error(error, what);
}

namespace {
std::atomic<bool> g_forked_child{false};
void on_fork_child() { g_forked_child = true; }

// TORCH_PJRT_MEMORY_LIMIT: bytes ("8GiB", "500M", "8000000000"), or a fraction of
// the device's memory ("0.5", "50%"). 0 / unset: no limit below the device's.
int64_t configured_limit(int64_t total) {
  const char* v = std::getenv("TORCH_PJRT_MEMORY_LIMIT");
  if (!v || !*v) return 0;
  std::string s(v);
  bool percent = !s.empty() && s.back() == '%';
  char* end = nullptr;
  double number = std::strtod(s.c_str(), &end);
  bool fraction = percent || (s.find('.') != std::string::npos && end && *end == '\0' && number <= 1.0);
  if (fraction) {
    double f = percent ? number / 100.0 : number;
    if (!(f > 0 && f <= 1.0) || (percent && std::string(end) != "%"))
      throw std::invalid_argument("torch_pjrt: TORCH_PJRT_MEMORY_LIMIT='" + s +
                                  "': a fraction must lie in (0, 1] (e.g. 0.5 or 50%)");
    if (total <= 0)
      throw std::invalid_argument("torch_pjrt: TORCH_PJRT_MEMORY_LIMIT='" + s +
                                  "' is a fraction of the device's memory, but the plugin does not report "
                                  "its size; give bytes instead (e.g. 8GiB)");
    return static_cast<int64_t>(f * static_cast<double>(total));
  }
  std::optional<int64_t> bytes = parse_byte_size(s);
  // (A plain number with a fraction past 1, "1.5": neither a fraction of the
  // memory nor whole bytes; it became a 1-byte limit.)
  bool unitless_fraction = s.find('.') != std::string::npos && end && *end == '\0';
  if (!bytes || unitless_fraction)
    throw std::invalid_argument("torch_pjrt: TORCH_PJRT_MEMORY_LIMIT must be bytes (e.g. 8GiB, 500M) or a "
                                "fraction of the device's memory (e.g. 0.5, 50%), got '" + s + "'");
  return *bytes;
}

int configured_max_inflight() {
  const char* v = std::getenv("TORCH_PJRT_MAX_INFLIGHT");
  if (!v || !*v) return 64;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (!end || *end || n < 1)
    throw std::invalid_argument(std::string("torch_pjrt: TORCH_PJRT_MAX_INFLIGHT must be a positive number of "
                                            "queued executions per device, got '") + v + "'");
  return static_cast<int>(n);
}
}  // namespace

bool in_forked_child() { return g_forked_child.load(std::memory_order_relaxed); }

void Runtime::initialize(const std::string& plugin_path, const std::string& name,
                         int64_t cpu_device_count) {
  if (instance()) return;
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { ::pthread_atfork(nullptr, nullptr, &on_fork_child); });
  add_plugin_flags(plugin_path);
  // Never dlclose: plugins keep threads and static state alive.
  void* handle = ::dlopen(plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw std::runtime_error("torch_pjrt: cannot load PJRT plugin '" + plugin_path +
                             "': " + ::dlerror());
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(::dlsym(handle, "GetPjrtApi"));
  if (!get_api)
    throw std::runtime_error("torch_pjrt: '" + plugin_path +
                             "' is not a PJRT plugin (no GetPjrtApi symbol)");
  const PJRT_Api* api = get_api();
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->api_ = api;
  rt->info_.name = name;
  rt->info_.path = plugin_path;
  rt->info_.api_major = api->pjrt_api_version.major_version;
  rt->info_.api_minor = api->pjrt_api_version.minor_version;
  if (rt->info_.api_major != PJRT_API_MAJOR || rt->info_.api_minor < kMinApiMinor)
    throw std::runtime_error(
        "torch_pjrt: PJRT plugin '" + plugin_path + "' reports C API " +
        std::to_string(rt->info_.api_major) + "." + std::to_string(rt->info_.api_minor) +
        "; this build needs " + std::to_string(PJRT_API_MAJOR) + "." +
        std::to_string(kMinApiMinor) + " or newer within major version " +
        std::to_string(PJRT_API_MAJOR));
  // The last function slot we call must lie inside the plugin's table.
  size_t needed = offsetof(PJRT_Api, PJRT_Executable_OutputDimensions) + sizeof(void*);
  if (api->struct_size < needed)
    throw std::runtime_error("torch_pjrt: PJRT plugin '" + plugin_path +
                             "' has a function table of " + std::to_string(api->struct_size) +
                             " bytes, smaller than the " + std::to_string(needed) +
                             " this build calls into");

  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  rt->check(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");

  auto attrs = PJRT_ARGS(PJRT_Plugin_Attributes_Args);
  rt->check(api->PJRT_Plugin_Attributes(&attrs), "PJRT_Plugin_Attributes");
  for (size_t i = 0; i < attrs.num_attributes; ++i) {
    const auto& a = attrs.attributes[i];
    rt->info_.attributes.emplace_back(std::string(a.name, a.name_size), named_value_string(a));
  }

  rt->small_program_options_ = small_program_options(plugin_path, name, kCompileOptionsBytes);
  rt->cpu_device_count_ = cpu_device_count;
  rt->create_client(nullptr, 0, 1);
  rt->cache_ = std::make_unique<PersistentCache>(PersistentCache::configured_dir(),
                                                 rt->cache_identity());
  size_t cache_slots = offsetof(PJRT_Api, PJRT_Executable_DeserializeAndLoad) + sizeof(void*);
  if (rt->cache_->enabled() &&
      (api->struct_size < cache_slots || !api->PJRT_Executable_Serialize ||
       !api->PJRT_Executable_DeserializeAndLoad || !api->PJRT_LoadedExecutable_GetExecutable))
    rt->cache_->disable("plugin '" + name + "' cannot serialize executables");
  instance() = std::move(rt);
}

// The client (and what is read from it: platform, devices, their memory).
// `kv` (with node_id < num_nodes): one process of a distributed job, finding
// the others through the store (PJRT_Client_Create's kv callbacks).
void Runtime::create_client(KeyValueStore* kv, int node_id, int num_nodes) {
  const std::string& name = info_.name;
  std::vector<PJRT_NamedValue> options;
  if (name == "cpu" && cpu_device_count_ > 0) {
    PJRT_NamedValue v = named_value("cpu_device_count", PJRT_NamedValue_kInt64);
    v.int64_value = cpu_device_count_;
    options.push_back(v);
  }
  if (name == "cuda") {
    // Leave GPU memory to PyTorch's own allocator when both share the GPU.
    PJRT_NamedValue v = named_value("preallocate", PJRT_NamedValue_kBool);
    v.bool_value = false;
    options.push_back(v);
  }
  if (kv) {
    // The GPU plugin's names (JAX's distributed client passes the same).
    PJRT_NamedValue id = named_value("node_id", PJRT_NamedValue_kInt64);
    id.int64_value = node_id;
    PJRT_NamedValue nodes = named_value("num_nodes", PJRT_NamedValue_kInt64);
    nodes.int64_value = num_nodes;
    options.push_back(id);
    options.push_back(nodes);
  }
  auto create = PJRT_ARGS(PJRT_Client_Create_Args);
  create.create_options = options.data();
  create.num_options = options.size();
  if (kv) attach_kv_callbacks(create, kv);
  check(api_->PJRT_Client_Create(&create), "PJRT_Client_Create");
  client_ = create.client;

  auto pn = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  pn.client = client_;
  check(api_->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  info_.platform.assign(pn.platform_name, pn.platform_name_size);
  auto pv = PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  pv.client = client_;
  check(api_->PJRT_Client_PlatformVersion(&pv), "PJRT_Client_PlatformVersion");
  info_.platform_version.assign(pv.platform_version, pv.platform_version_size);

  auto dev = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  dev.client = client_;
  check(api_->PJRT_Client_AddressableDevices(&dev), "PJRT_Client_AddressableDevices");
  devices_.assign(dev.addressable_devices, dev.addressable_devices + dev.num_addressable_devices);
  if (devices_.empty())
    throw std::runtime_error("torch_pjrt: PJRT plugin '" + info_.path + "' reports no addressable devices");

  size_t n = devices_.size();
  pending_.clear();
  pending_.resize(n);
  launched_.assign(n, 0);
  awaited_.reset(new std::atomic<int64_t>[n]);
  for (size_t d = 0; d < n; ++d) awaited_[d] = 0;
  check_words_.clear();
  check_words_.resize(n);
  check_dirty_.assign(n, false);
  check_deferred_.assign(n, false);
  max_inflight_ = configured_max_inflight();
  limits_.reset(new std::atomic<int64_t>[n]);
  totals_.assign(n, 0);
  for (size_t d = 0; d < n; ++d) {
    totals_[d] = query_total_memory(static_cast<int>(d));
    limits_[d] = configured_limit(totals_[d]);
  }
}

bool Runtime::initialized() { return static_cast<bool>(instance()); }

Runtime& Runtime::get() {
  if (!instance())
    throw std::runtime_error("torch_pjrt: the PJRT runtime is not initialized (import torch_pjrt)");
  if (in_forked_child())
    raise(ErrorKind::Runtime,
          "torch_pjrt: cannot use the tpu device in a forked subprocess: its PJRT client (plugin '" +
              instance()->info_.name +
              "') was created in the parent process and does not exist in the child. To use tpu tensors "
              "with multiprocessing, use the 'spawn' or 'forkserver' start method "
              "(torch.multiprocessing.set_start_method('spawn'), or DataLoader(..., "
              "multiprocessing_context='spawn')); fork workers that only touch CPU tensors keep working.");
  return *instance();
}

Runtime* Runtime::get_unchecked() { return instance().get(); }

void Runtime::check_device(int index) const {
  if (index < 0 || index >= device_count())
    throw std::runtime_error("torch_pjrt: invalid device index " + std::to_string(index) +
                             ": plugin '" + info_.name + "' has " +
                             std::to_string(device_count()) + " device(s)");
}

std::string Runtime::device_kind(int index) const {
  check_device(index);
  auto gd = PJRT_ARGS(PJRT_Device_GetDescription_Args);
  gd.device = devices_[index];
  check(api_->PJRT_Device_GetDescription(&gd), "PJRT_Device_GetDescription");
  auto k = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  k.device_description = gd.device_description;
  check(api_->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
  return std::string(k.device_kind, k.device_kind_size);
}

void Runtime::await_and_destroy(PJRT_Event* event, const char* what) {
  if (!event) return;
  auto aw = PJRT_ARGS(PJRT_Event_Await_Args);
  aw.event = event;
  PJRT_Error* err = api_->PJRT_Event_Await(&aw);
  auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
  d.event = event;
  api_->PJRT_Event_Destroy(&d);
  check(err, what);
}

BufferPtr Runtime::buffer_from_host(const void* data, PJRT_Buffer_Type type,
                                    const std::vector<int64_t>& dims, int device, bool tracked) {
  check_device(device);
  auto args = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = client_;
  args.data = data;
  args.type = type;
  args.dims = dims.data();
  args.num_dims = dims.size();
  // The plugin copies before returning, so the caller may free `data` at once.
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = devices_[device];
  size_t n = element_size(type);
  for (auto d : dims) n *= d;
  if (tracked) ensure_fits(device, static_cast<int64_t>(n), "a host-to-device copy");
  check(api_->PJRT_Client_BufferFromHostBuffer(&args), "host-to-device transfer");
  auto buffer = std::make_shared<Buffer>(api_, args.buffer, device, static_cast<int64_t>(n), tracked);
  // (Not left to finish in the background: a copy the plugin makes on its
  // worker delayed the program reading it, and a compiled GPT step ran at
  // 0.93-0.94x PyTorch CPU against 1.07-1.20x when waited for here.)
  await_and_destroy(args.done_with_host_buffer, "host-to-device transfer");
  metrics().host_to_device_bytes += n;
  return buffer;
}

// A host read waits a little by polling before it sleeps in the plugin's
// wait: a small program finishes within tens of microseconds, and being woken
// from a futex costs about as much again on the reading thread's critical path
// (the tiny Llama's fused decode read: 0.09 -> 0.07-0.08 ms per token here).
void Runtime::spin_until_ready(PJRT_Event* event) {
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kReadSpinMicros);
  auto ready = PJRT_ARGS(PJRT_Event_IsReady_Args);
  ready.event = event;
  for (int i = 1;; ++i) {
    if (PJRT_Error* err = api_->PJRT_Event_IsReady(&ready)) {
      discard(api_, err);
      return;
    }
    if (ready.is_ready) return;
    if (i % 16 == 0 && std::chrono::steady_clock::now() > until) return;
    // Yields rather than pauses: on a machine with few cores the thread
    // finishing the work may be waiting for this core.
    sched_yield();
  }
}

bool Runtime::read_in_place(PJRT_Buffer* buffer, void* dst, size_t nbytes) {
  // Only a flat buffer in host memory (the CPU plugin's): its bytes are the
  // host layout's.
  auto cpu = PJRT_ARGS(PJRT_Buffer_IsOnCpu_Args);
  cpu.buffer = buffer;
  if (PJRT_Error* err = api_->PJRT_Buffer_IsOnCpu(&cpu)) {
    discard(api_, err);
    return false;
  }
  if (!cpu.is_on_cpu) return false;
  auto dims = PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  dims.buffer = buffer;
  if (PJRT_Error* err = api_->PJRT_Buffer_Dimensions(&dims)) {
    discard(api_, err);
    return false;
  }
  if (dims.num_dims > 1) return false;
  auto size = PJRT_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args);
  size.buffer = buffer;
  if (PJRT_Error* err = api_->PJRT_Buffer_OnDeviceSizeInBytes(&size)) {
    discard(api_, err);
    return false;
  }
  if (size.on_device_size_in_bytes < nbytes) return false;
  auto ready = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer;
  check(api_->PJRT_Buffer_ReadyEvent(&ready), "device-to-host transfer");
  spin_until_ready(ready.event);
  await_and_destroy(ready.event, "device-to-host transfer");  // raises the error of the work that made it
  auto at = PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args);
  at.buffer = buffer;
  if (PJRT_Error* err = api_->PJRT_Buffer_UnsafePointer(&at)) {
    discard(api_, err);
    return false;
  }
  if (nbytes) std::memcpy(dst, reinterpret_cast<const void*>(at.buffer_pointer), nbytes);
  metrics().host_reads_in_place++;
  return true;
}

void Runtime::read_to_host(PJRT_Buffer* buffer, void* dst, size_t nbytes, const char* what) {
  // In host memory (the CPU plugin): a copy once the buffer is ready. The
  // plugin's transfer hands that copy to a worker thread and waits for it,
  // two thread wake-ups (20-50 us here) for a few bytes.
  if (read_in_place(buffer, dst, nbytes)) return;
  auto args = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer;
  args.dst = dst;
  args.dst_size = nbytes;
  check(api_->PJRT_Buffer_ToHostBuffer(&args), what);
  await_and_destroy(args.event, what);
}

void Runtime::buffer_to_host(const Buffer& buffer, void* dst, size_t nbytes) {
  metrics().host_waits++;
  read_to_host(buffer.get(), dst, nbytes, "device-to-host transfer");
  metrics().device_to_host_bytes += nbytes;
  report_checks(buffer.device_index(), false, /*reading=*/true);
}

BufferPtr Runtime::copy_to_device(const Buffer& buffer, int device, size_t nbytes) {
  check_device(device);
  auto args = PJRT_ARGS(PJRT_Buffer_CopyToDevice_Args);
  args.buffer = buffer.get();
  args.dst_device = devices_[device];
  ensure_fits(device, static_cast<int64_t>(nbytes), "a device-to-device copy");
  check(api_->PJRT_Buffer_CopyToDevice(&args), "device-to-device copy");
  metrics().device_to_device_bytes += nbytes;
  return std::make_shared<Buffer>(api_, args.dst_buffer, device, static_cast<int64_t>(nbytes));
}

// Everything an executable compiled from a given program depends on besides
// the program and the compile options: the plugin build, its API, and the
// devices and host it compiles for. Part of every persistent-cache key.
namespace {
// What the plugin file holds, without its path or file time: its size and a
// SHA-256 of 4 MiB sampled across it (the first and last 512 KiB, 96 chunks
// of 32 KiB evenly between; ~15 ms). A rebuilt plugin differs throughout (addresses,
// offsets), so sampling finds it; hashing all of a 250 MB plugin would cost
// about a second per process. Keyed by content, a new venv or clone with the
// same plugin wheel reuses the executables its predecessors compiled.
std::string plugin_fingerprint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  struct stat st;
  if (!f || ::stat(path.c_str(), &st) != 0) return "unreadable";
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  constexpr uint64_t kEdge = 512 << 10, kChunk = 32 << 10, kChunks = 96;
  Sha256 h;
  std::string buf;
  auto take = [&](uint64_t at, uint64_t n) {
    if (at >= size) return;
    n = std::min(n, size - at);
    buf.resize(n);
    f.seekg(static_cast<std::streamoff>(at));
    f.read(buf.data(), static_cast<std::streamsize>(n));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  };
  if (size <= 2 * kEdge + kChunks * kChunk) {
    take(0, size);
  } else {
    take(0, kEdge);
    const uint64_t span = size - 2 * kEdge - kChunk;
    for (uint64_t i = 0; i < kChunks; ++i) take(kEdge + span * i / (kChunks - 1), kChunk);
    take(size - kEdge, kEdge);
  }
  return std::to_string(size) + " bytes, sampled sha256 " + Sha256::hex(h.finish());
}
}  // namespace

// Everything an executable compiled from a given program depends on besides
// the program and the compile options: the plugin build (by content), its API,
// and the devices and host it compiles for. Part of every persistent-cache key.
std::string Runtime::cache_identity() const {
  std::string s = "torch_pjrt executable cache identity\n";
  const char* slash = std::strrchr(info_.path.c_str(), '/');
  s += "plugin=" + std::string(slash ? slash + 1 : info_.path.c_str()) + "\n";
  s += "plugin_content=" + plugin_fingerprint(info_.path) + "\n";
  s += "platform=" + one_line(info_.platform) + "\n";
  s += "platform_version=" + one_line(info_.platform_version) + "\n";
  s += "pjrt_c_api=" + std::to_string(info_.api_major) + "." + std::to_string(info_.api_minor) +
       "\n";
  for (const auto& [k, v] : info_.attributes) s += "attribute." + one_line(k) + "=" + one_line(v) + "\n";
  s += "devices=" + std::to_string(devices_.size()) + " x " + one_line(device_kind(0)) + "\n";
  s += "host_cpu=" + one_line(host_cpu_description()) + "\n";
  // The compiler's flags change what a program compiles to.
  for (const char* env : {"XLA_FLAGS", "LIBTPU_INIT_ARGS"}) {
    const char* v = std::getenv(env);
    s += std::string(env) + "=" + one_line(v ? v : "") + "\n";
  }
  return s;
}

ExecutablePtr Runtime::wrap(PJRT_LoadedExecutable* loaded) {
  auto ge = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&ge), "GetExecutable");
  ExecutableRelease release{api_, ge.executable};  // the unloaded view is ours to destroy
  auto no = PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = ge.executable;
  check(api_->PJRT_Executable_NumOutputs(&no), "NumOutputs");
  // Output sizes: what each execution allocates (memory accounting, limit).
  auto ot = PJRT_ARGS(PJRT_Executable_OutputElementTypes_Args);
  ot.executable = ge.executable;
  check(api_->PJRT_Executable_OutputElementTypes(&ot), "OutputElementTypes");
  auto od = PJRT_ARGS(PJRT_Executable_OutputDimensions_Args);
  od.executable = ge.executable;
  check(api_->PJRT_Executable_OutputDimensions(&od), "OutputDimensions");
  if (ot.num_output_types != no.num_outputs || od.num_outputs != no.num_outputs)
    raise(ErrorKind::Runtime, "torch_pjrt: plugin '" + info_.name + "' describes " +
                                  std::to_string(ot.num_output_types) + " output types and " +
                                  std::to_string(od.num_outputs) + " output shapes for " +
                                  std::to_string(no.num_outputs) + " outputs");
  std::vector<int64_t> bytes(no.num_outputs);
  const int64_t* dim = od.dims;
  for (size_t i = 0; i < no.num_outputs; ++i) {
    int64_t n = static_cast<int64_t>(element_size(ot.output_types[i]));
    for (size_t k = 0; k < od.dim_sizes[i]; ++k) n *= *dim++;
    bytes[i] = n;
  }
  auto cs = PJRT_ARGS(PJRT_Executable_SizeOfGeneratedCodeInBytes_Args);
  cs.executable = ge.executable;
  int64_t code = 0;
  if (PJRT_Error* err = api_->PJRT_Executable_SizeOfGeneratedCodeInBytes(&cs)) discard(api_, err);
  else code = cs.size_in_bytes > 0 ? cs.size_in_bytes : 0;
  return std::make_shared<Executable>(api_, loaded, std::move(bytes), code);
}

// A hit: the entry's executable, loaded onto this client. Null on a miss or
// a bad entry (reported and counted by the cache).
ExecutablePtr Runtime::load_cached(const std::string& mlir_text, const Sha256::Digest& key) {
  return load_by_key(key, mlir_text.size());
}

ExecutablePtr Runtime::load_by_key(const Sha256::Digest& key, size_t program_size) {
  auto t0 = std::chrono::steady_clock::now();
  auto payload = cache_->load(key, program_size);
  if (!payload) return nullptr;
  auto args = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  args.client = client_;
  args.serialized_executable = payload->data();
  args.serialized_executable_size = payload->size();
  args.overridden_serialized_compile_options = kCompileOptions;
  args.overridden_serialized_compile_options_size = sizeof(kCompileOptions);
  if (PJRT_Error* err = api_->PJRT_Executable_DeserializeAndLoad(&args)) {
    cache_->report_bad_entry(cache_->path(key),
                             "does not load: " + one_line(take_message(api_, err)));
    return nullptr;
  }
  ExecutablePtr exe;
  try {
    exe = wrap(args.loaded_executable);
  } catch (const std::exception& e) {
    auto d = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
    d.executable = args.loaded_executable;
    discard(api_, api_->PJRT_LoadedExecutable_Destroy(&d));
    cache_->report_bad_entry(cache_->path(key), std::string("does not load: ") + e.what());
    return nullptr;
  }
  metrics().persistent_cache_hits++;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics().persistent_cache_load_seconds = metrics().persistent_cache_load_seconds + secs;
  return exe;
}

void Runtime::save_to_cache(PJRT_LoadedExecutable* loaded, const std::string& mlir_text,
                            const Sha256::Digest& key) {
  struct Timer {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timer() {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      metrics().persistent_cache_save_seconds = metrics().persistent_cache_save_seconds + secs;
    }
  } timer;
  auto ge = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = loaded;
  if (PJRT_Error* err = api_->PJRT_LoadedExecutable_GetExecutable(&ge)) {
    cache_->disable("GetExecutable failed: " + one_line(take_message(api_, err)));
    return;
  }
  auto ser = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  ser.executable = ge.executable;
  PJRT_Error* err = api_->PJRT_Executable_Serialize(&ser);
  std::string payload;
  if (!err) {
    payload.assign(ser.serialized_bytes, ser.serialized_bytes_size);
    if (ser.serialized_executable_deleter) ser.serialized_executable_deleter(ser.serialized_executable);
  }
  auto ed = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  ed.executable = ge.executable;
  discard(api_, api_->PJRT_Executable_Destroy(&ed));
  if (err) {
    cache_->disable("plugin '" + info_.name + "' cannot serialize executables: " +
                    one_line(take_message(api_, err)));
    return;
  }
  cache_->store(key, mlir_text.size(), payload);
}

ExecutablePtr Runtime::compile(const std::string& mlir_text) {
  const std::string& options =
      !small_program_options_.empty() && suits_small_program_options(mlir_text)
          ? small_program_options_
          : kCompileOptionsBytes;
  std::optional<Sha256::Digest> key;
  if (cache_->enabled()) {
    key = cache_->key(mlir_text, options);
    prefetch::note(*key, mlir_text.size());
    if (auto exe = prefetch::take(*key)) return exe;  // loaded ahead (and counted) by the prefetch thread
    if (auto exe = load_cached(mlir_text, *key)) return exe;
    metrics().persistent_cache_misses++;
  }

  PJRT_LoadedExecutable* loaded = compile_with(mlir_text, options, "compile");
  ExecutablePtr exe = wrap(loaded);
  if (key && cache_->enabled()) save_to_cache(loaded, mlir_text, *key);
  return exe;
}

PJRT_LoadedExecutable* Runtime::compile_with(const std::string& mlir_text, const std::string& options,
                                             const char* what) {
  auto t0 = std::chrono::steady_clock::now();
  PJRT_Program program = mlir_program(mlir_text);
  auto args = PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  check(api_->PJRT_Client_Compile(&args), what);
  metrics().xla_compiles++;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics().compile_seconds = metrics().compile_seconds + secs;
  return args.executable;
}

}  // namespace torch_pjrt::runtime
