// Client, buffers, compile and execute over the PJRT C API.
#include "pjrt_runtime.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>

namespace torch_pjrt::runtime {
namespace {

// The oldest PJRT C API minor version whose struct layouts we rely on.
constexpr int kMinApiMinor = 40;

// Never destroyed: at process exit tensors, cached executables and PyTorch's
// autograd device threads may still hold PJRT objects, and tearing the client
// down under them aborts ("terminate called without an active exception").
std::unique_ptr<Runtime>& instance() {
  static auto* rt = new std::unique_ptr<Runtime>();
  return *rt;
}

template <typename T>
T make_args(size_t size) {
  T args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = size;
  return args;
}
#define PJRT_ARGS(T) make_args<T>(T##_STRUCT_SIZE)

// Serialized xla.CompileOptionsProto: executable_build_options (field 3) with
// num_replicas = 1 (field 4) and num_partitions = 1 (field 5), then
// compile_portable_executable = true (field 4) so one executable runs on any
// device chosen at execute time.
const char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
const std::string kCompileOptionsBytes(kCompileOptions, sizeof(kCompileOptions));

std::string named_value_string(const PJRT_NamedValue& v) {
  switch (v.type) {
    case PJRT_NamedValue_kString:
      return std::string(v.string_value, v.value_size);
    case PJRT_NamedValue_kInt64:
      return std::to_string(v.int64_value);
    case PJRT_NamedValue_kInt64List: {
      std::string s;
      for (size_t i = 0; i < v.value_size; ++i)
        s += (i ? "," : "") + std::to_string(v.int64_array_value[i]);
      return s;
    }
    case PJRT_NamedValue_kFloat:
      return std::to_string(v.float_value);
    case PJRT_NamedValue_kBool:
      return v.bool_value ? "true" : "false";
  }
  return "";
}

// The error's message; frees the error.
std::string take_message(const PJRT_Api* api, PJRT_Error* error) {
  auto m = PJRT_ARGS(PJRT_Error_Message_Args);
  m.error = error;
  api->PJRT_Error_Message(&m);
  std::string msg(m.message, m.message_size);
  auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = error;
  api->PJRT_Error_Destroy(&d);
  return msg;
}

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

// Frees an error nobody can act on (destructors, readiness polling).
void discard(const PJRT_Api* api, PJRT_Error* err) {
  if (!err) return;
  auto d = PJRT_ARGS(PJRT_Error_Destroy_Args);
  d.error = err;
  api->PJRT_Error_Destroy(&d);
}

// A scalar client option; the caller sets the value field.
PJRT_NamedValue named_value(const char* name, PJRT_NamedValue_Type type) {
  PJRT_NamedValue v;
  std::memset(&v, 0, sizeof(v));
  v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  v.name = name;
  v.name_size = std::strlen(name);
  v.type = type;
  v.value_size = 1;
  return v;
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

Buffer::~Buffer() {
  auto args = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  discard(api_, api_->PJRT_Buffer_Destroy(&args));
}

Executable::~Executable() {
  auto args = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = exe_;
  discard(api_, api_->PJRT_LoadedExecutable_Destroy(&args));
}

void Runtime::check(PJRT_Error* error, const char* what) const {
  if (!error) return;
  std::string msg = take_message(api_, error);
  throw std::runtime_error("torch_pjrt: " + std::string(what) + " failed in PJRT plugin '" +
                           info_.name + "': " + msg);
}

void Runtime::initialize(const std::string& plugin_path, const std::string& name,
                         int64_t cpu_device_count) {
  if (instance()) return;
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

  std::vector<PJRT_NamedValue> options;
  if (name == "cpu" && cpu_device_count > 0) {
    PJRT_NamedValue v = named_value("cpu_device_count", PJRT_NamedValue_kInt64);
    v.int64_value = cpu_device_count;
    options.push_back(v);
  }
  if (name == "cuda") {
    // Leave GPU memory to PyTorch's own allocator when both share the GPU.
    PJRT_NamedValue v = named_value("preallocate", PJRT_NamedValue_kBool);
    v.bool_value = false;
    options.push_back(v);
  }
  auto create = PJRT_ARGS(PJRT_Client_Create_Args);
  create.create_options = options.data();
  create.num_options = options.size();
  rt->check(api->PJRT_Client_Create(&create), "PJRT_Client_Create");
  rt->client_ = create.client;

  auto pn = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  pn.client = rt->client_;
  rt->check(api->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  rt->info_.platform.assign(pn.platform_name, pn.platform_name_size);
  auto pv = PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  pv.client = rt->client_;
  rt->check(api->PJRT_Client_PlatformVersion(&pv), "PJRT_Client_PlatformVersion");
  rt->info_.platform_version.assign(pv.platform_version, pv.platform_version_size);

  auto dev = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  dev.client = rt->client_;
  rt->check(api->PJRT_Client_AddressableDevices(&dev), "PJRT_Client_AddressableDevices");
  rt->devices_.assign(dev.addressable_devices, dev.addressable_devices + dev.num_addressable_devices);
  if (rt->devices_.empty())
    throw std::runtime_error("torch_pjrt: PJRT plugin '" + plugin_path +
                             "' reports no addressable devices");

  rt->cache_ = std::make_unique<PersistentCache>(PersistentCache::configured_dir(),
                                                 rt->cache_identity());
  size_t cache_slots = offsetof(PJRT_Api, PJRT_Executable_DeserializeAndLoad) + sizeof(void*);
  if (rt->cache_->enabled() &&
      (api->struct_size < cache_slots || !api->PJRT_Executable_Serialize ||
       !api->PJRT_Executable_DeserializeAndLoad || !api->PJRT_LoadedExecutable_GetExecutable))
    rt->cache_->disable("plugin '" + name + "' cannot serialize executables");
  instance() = std::move(rt);
}

bool Runtime::initialized() { return static_cast<bool>(instance()); }

Runtime& Runtime::get() {
  if (!instance())
    throw std::runtime_error("torch_pjrt: the PJRT runtime is not initialized (import torch_pjrt)");
  return *instance();
}

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
                                    const std::vector<int64_t>& dims, int device) {
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
  check(api_->PJRT_Client_BufferFromHostBuffer(&args), "host-to-device transfer");
  await_and_destroy(args.done_with_host_buffer, "host-to-device transfer");
  size_t n = element_size(type);
  for (auto d : dims) n *= d;
  metrics().host_to_device_bytes += n;
  return std::make_shared<Buffer>(api_, args.buffer, device);
}

void Runtime::buffer_to_host(const Buffer& buffer, void* dst, size_t nbytes) {
  auto args = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer.get();
  args.dst = dst;
  args.dst_size = nbytes;
  check(api_->PJRT_Buffer_ToHostBuffer(&args), "device-to-host transfer");
  metrics().host_waits++;
  await_and_destroy(args.event, "device-to-host transfer");
  metrics().device_to_host_bytes += nbytes;
}

BufferPtr Runtime::copy_to_device(const Buffer& buffer, int device, size_t nbytes) {
  check_device(device);
  auto args = PJRT_ARGS(PJRT_Buffer_CopyToDevice_Args);
  args.buffer = buffer.get();
  args.dst_device = devices_[device];
  check(api_->PJRT_Buffer_CopyToDevice(&args), "device-to-device copy");
  metrics().device_to_device_bytes += nbytes;
  return std::make_shared<Buffer>(api_, args.dst_buffer, device);
}

// Everything an executable compiled from a given program depends on besides
// the program and the compile options: the plugin build, its API, and the
// devices and host it compiles for. Part of every persistent-cache key.
std::string Runtime::cache_identity() const {
  std::string s = "torch_pjrt executable cache identity\n";
  char resolved[PATH_MAX];
  s += "plugin_path=" +
       std::string(::realpath(info_.path.c_str(), resolved) ? resolved : info_.path.c_str()) +
       "\n";
  struct stat st;
  if (::stat(info_.path.c_str(), &st) == 0)
    s += "plugin_file=" + std::to_string(st.st_size) + " bytes, modified " +
         std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "\n";
  s += "platform=" + one_line(info_.platform) + "\n";
  s += "platform_version=" + one_line(info_.platform_version) + "\n";
  s += "pjrt_c_api=" + std::to_string(info_.api_major) + "." + std::to_string(info_.api_minor) +
       "\n";
  for (const auto& [k, v] : info_.attributes) s += "attribute." + one_line(k) + "=" + one_line(v) + "\n";
  s += "devices=" + std::to_string(devices_.size()) + " x " + one_line(device_kind(0)) + "\n";
  s += "host_cpu=" + one_line(host_cpu_description()) + "\n";
  return s;
}

ExecutablePtr Runtime::wrap(PJRT_LoadedExecutable* loaded) {
  auto ge = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = loaded;
  check(api_->PJRT_LoadedExecutable_GetExecutable(&ge), "GetExecutable");
  auto no = PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = ge.executable;
  PJRT_Error* err = api_->PJRT_Executable_NumOutputs(&no);
  auto ed = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  ed.executable = ge.executable;
  discard(api_, api_->PJRT_Executable_Destroy(&ed));
  check(err, "NumOutputs");
  return std::make_shared<Executable>(api_, loaded, no.num_outputs);
}

// A hit: the entry's executable, loaded onto this client. Null on a miss or
// a bad entry (reported and counted by the cache).
ExecutablePtr Runtime::load_cached(const std::string& mlir_text, const Sha256::Digest& key) {
  auto t0 = std::chrono::steady_clock::now();
  auto payload = cache_->load(key, mlir_text.size());
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
  std::optional<Sha256::Digest> key;
  if (cache_->enabled()) {
    key = cache_->key(mlir_text, kCompileOptionsBytes);
    if (auto exe = load_cached(mlir_text, *key)) return exe;
    metrics().persistent_cache_misses++;
  }

  auto t0 = std::chrono::steady_clock::now();
  auto program = PJRT_ARGS(PJRT_Program);
  program.code = const_cast<char*>(mlir_text.data());
  program.code_size = mlir_text.size();
  program.format = "mlir";
  program.format_size = 4;
  auto args = PJRT_ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  args.compile_options = kCompileOptions;
  args.compile_options_size = sizeof(kCompileOptions);
  check(api_->PJRT_Client_Compile(&args), "compile");
  metrics().xla_compiles++;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  metrics().compile_seconds = metrics().compile_seconds + secs;

  ExecutablePtr exe = wrap(args.executable);
  if (key && cache_->enabled()) save_to_cache(args.executable, mlir_text, *key);
  return exe;
}

std::vector<BufferPtr> Runtime::execute(const Executable& exe,
                                        const std::vector<PJRT_Buffer*>& args, int device) {
  check_device(device);
  auto options = PJRT_ARGS(PJRT_ExecuteOptions);
  std::vector<PJRT_Buffer*> outputs(exe.num_outputs(), nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** out_list = outputs.data();
  PJRT_Event* done = nullptr;
  auto ex = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe.get();
  ex.options = &options;
  ex.argument_lists = &arg_list;
  ex.num_devices = 1;
  ex.num_args = args.size();
  ex.output_lists = &out_list;
  ex.device_complete_events = &done;
  ex.execute_device = devices_[device];
  check(api_->PJRT_LoadedExecutable_Execute(&ex), "execute");
  metrics().executions++;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_.emplace_back(device, done);
    if (pending_.size() > 256) prune_pending_locked();
  }
  std::vector<BufferPtr> result;
  result.reserve(outputs.size());
  for (auto* b : outputs) result.push_back(std::make_shared<Buffer>(api_, b, device));
  return result;
}

void Runtime::prune_pending_locked() {
  std::vector<std::pair<int, PJRT_Event*>> keep;
  for (auto& [dev, ev] : pending_) {
    auto r = PJRT_ARGS(PJRT_Event_IsReady_Args);
    r.event = ev;
    PJRT_Error* err = api_->PJRT_Event_IsReady(&r);
    if (err || !r.is_ready) {
      discard(api_, err);
      keep.emplace_back(dev, ev);
      continue;
    }
    // Ready: an execution error (if any) surfaces again when its outputs are read.
    auto e = PJRT_ARGS(PJRT_Event_Error_Args);
    e.event = ev;
    discard(api_, api_->PJRT_Event_Error(&e));
    auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
    d.event = ev;
    api_->PJRT_Event_Destroy(&d);
  }
  pending_.swap(keep);
}

void Runtime::synchronize(int device) {
  metrics().host_waits++;
  std::vector<std::pair<int, PJRT_Event*>> mine;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    std::vector<std::pair<int, PJRT_Event*>> rest;
    for (auto& p : pending_) (device < 0 || p.first == device ? mine : rest).push_back(p);
    pending_.swap(rest);
  }
  std::string first_error;
  for (auto& [dev, ev] : mine) {
    try {
      await_and_destroy(ev, "execution");
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw std::runtime_error(first_error);
}

}  // namespace torch_pjrt::runtime
