#include "runtime/topology_compiler.h"

#include <dirent.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <thread>

#include "runtime/errors.h"
#include "runtime/pjrt_util.h"
#include "runtime/plugin_flags.h"
#include "runtime/proto_writer.h"

namespace torch_pjrt::runtime {
namespace {

using proto::field_bytes;
using proto::field_varint;

// CompileOptionsProto{executable_build_options (3): {num_replicas (4),
// num_partitions (5), use_spmd_partitioning (6),
// allow_spmd_sharding_propagation_to_output (12, packed: outputs keep the
// sharding the partitioner finds instead of being gathered)}}.
std::string compile_options(int replicas, int partitions, bool spmd) {
  std::string build;
  field_varint(build, 4, replicas);
  field_varint(build, 5, partitions);
  if (spmd) {
    field_varint(build, 6, 1);
    field_bytes(build, 12, std::string(1, '\x01'));
  }
  std::string options;
  field_bytes(options, 3, build);
  return options;
}

std::map<std::string, std::string> attributes_of(const PJRT_NamedValue* values, size_t n) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < n; ++i) out[std::string(values[i].name, values[i].name_size)] = named_value_string(values[i]);
  return out;
}

// libtpu looks for a TPU and, without one, asks the cloud metadata server,
// retrying for minutes; these say there is none to ask (as JAX does).
void set_no_tpu_environment() {
  setenv("TPU_SKIP_MDS_QUERY", "1", 0);
  setenv("TPU_WORKER_ID", "0", 0);
  setenv("TPU_WORKER_HOSTNAMES", "localhost", 0);
  // Only silences "could not determine TPU accelerator type" on stderr;
  // topologies are still made from the names asked for.
  setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4", 0);
  // With no chip to share, several processes may compile at once (libtpu
  // otherwise takes /tmp/libtpu_lockfile and a second process fails).
  setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  setenv("TF_CPP_MIN_LOG_LEVEL", "2", 0);
}

}  // namespace

bool tpu_present() {
  DIR* dir = ::opendir("/sys/bus/pci/devices");
  if (!dir) return false;
  bool found = false;
  while (dirent* e = ::readdir(dir)) {
    std::ifstream vendor(std::string("/sys/bus/pci/devices/") + e->d_name + "/vendor");
    std::string v;
    if (vendor >> v && v == "0x1ae0") found = true;
  }
  ::closedir(dir);
  return found;
}

std::shared_ptr<CompileOnlyPlugin> CompileOnlyPlugin::load(const std::string& path, double timeout_s) {
  if (!tpu_present()) set_no_tpu_environment();
  auto plugin = std::shared_ptr<CompileOnlyPlugin>(new CompileOnlyPlugin());
  plugin->path_ = path;
  // Loading and initializing run on a thread of their own, so that a plugin
  // that blocks (a metadata server that never answers) cannot hang us: after
  // the deadline it is left behind and we raise.
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  auto api_out = std::make_shared<const PJRT_Api*>(nullptr);
  drop_flags_unknown_to(path);  // libtpu reads XLA_FLAGS too
  std::thread([path, result, api_out] {
    std::string error;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: plugins keep state
    if (!handle) {
      result->set_value(std::string("cannot load it: ") + ::dlerror());
      return;
    }
    using GetApiFn = const PJRT_Api* (*)();
    auto get_api = reinterpret_cast<GetApiFn>(::dlsym(handle, "GetPjrtApi"));
    if (!get_api) {
      result->set_value("it is not a PJRT plugin (no GetPjrtApi symbol)");
      return;
    }
    const PJRT_Api* api = get_api();
    size_t needed = offsetof(PJRT_Api, PJRT_Compile) + sizeof(void*);
    if (api->pjrt_api_version.major_version != PJRT_API_MAJOR || api->struct_size < needed) {
      result->set_value("its PJRT C API (" + std::to_string(api->pjrt_api_version.major_version) + "." +
                        std::to_string(api->pjrt_api_version.minor_version) +
                        ") has no topology compile this build can call");
      return;
    }
    auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
    if (PJRT_Error* err = api->PJRT_Plugin_Initialize(&init)) {
      result->set_value("PJRT_Plugin_Initialize failed: " + take_message(api, err));
      return;
    }
    *api_out = api;
    result->set_value("");
  }).detach();
  auto deadline = std::chrono::duration<double>(timeout_s);
  if (done.wait_for(deadline) != std::future_status::ready)
    raise(ErrorKind::Runtime,
          "torch_pjrt: the compile-only plugin '" + path + "' did not start within " + std::to_string(int(timeout_s)) +
              " s (TPU_SKIP_MDS_QUERY=" + (getenv("TPU_SKIP_MDS_QUERY") ? getenv("TPU_SKIP_MDS_QUERY") : "unset") +
              "; without a TPU libtpu must not query the cloud metadata server)");
  std::string error = done.get();
  if (!error.empty()) raise(ErrorKind::Runtime, "torch_pjrt: compile-only plugin '" + path + "': " + error);
  plugin->api_ = *api_out;
  return plugin;
}

void CompileOnlyPlugin::check(PJRT_Error* error, const char* what) const {
  if (error) raise(ErrorKind::Runtime, "torch_pjrt: " + std::string(what) + " failed in '" + path_ +
                                           "': " + take_message(api_, error));
}

std::string CompileOnlyPlugin::api_version() const {
  return std::to_string(api_->pjrt_api_version.major_version) + "." +
         std::to_string(api_->pjrt_api_version.minor_version);
}

Topology::~Topology() {
  if (!topology_ || !plugin_) return;
  auto d = PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args);
  d.topology = topology_;
  discard(plugin_->api(), plugin_->api()->PJRT_TopologyDescription_Destroy(&d));
}

std::shared_ptr<Topology> CompileOnlyPlugin::topology(const std::string& name,
                                                      const std::vector<TopologyOption>& options) const {
  std::vector<PJRT_NamedValue> values;
  for (const auto& o : options) {
    PJRT_NamedValue v = named_value(o.name.c_str(), PJRT_NamedValue_kInt64);
    switch (o.kind) {
      case TopologyOption::Int:
        v.int64_value = o.i;
        break;
      case TopologyOption::IntList:
        v.type = PJRT_NamedValue_kInt64List;
        v.int64_array_value = o.list.data();
        v.value_size = o.list.size();
        break;
      case TopologyOption::String:
        v.type = PJRT_NamedValue_kString;
        v.string_value = o.s.c_str();
        v.value_size = o.s.size();
        break;
      case TopologyOption::Bool:
        v.type = PJRT_NamedValue_kBool;
        v.bool_value = o.b;
        break;
    }
    values.push_back(v);
  }
  auto args = PJRT_ARGS(PJRT_TopologyDescription_Create_Args);
  args.topology_name = name.c_str();
  args.topology_name_size = name.size();
  args.create_options = values.data();
  args.num_options = values.size();
  if (PJRT_Error* err = api_->PJRT_TopologyDescription_Create(&args))
    raise(ErrorKind::Value, "torch_pjrt: no TPU topology '" + name + "' (" + take_message(api_, err) +
                                "); names look like v5e:2x2, v6e:2x2, v4:2x2x1, v5p:2x2x1, tpu7x:2x2x1");
  auto topo = std::shared_ptr<Topology>(new Topology());
  topo->plugin_ = shared_from_this();
  topo->topology_ = args.topology;
  TopologyInfo& info = topo->info_;
  info.name = name;
  auto pn = PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args);
  pn.topology = args.topology;
  check(api_->PJRT_TopologyDescription_PlatformName(&pn), "PJRT_TopologyDescription_PlatformName");
  info.platform.assign(pn.platform_name, pn.platform_name_size);
  auto pv = PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args);
  pv.topology = args.topology;
  check(api_->PJRT_TopologyDescription_PlatformVersion(&pv), "PJRT_TopologyDescription_PlatformVersion");
  info.platform_version.assign(pv.platform_version, pv.platform_version_size);
  auto at = PJRT_ARGS(PJRT_TopologyDescription_Attributes_Args);
  at.topology = args.topology;
  check(api_->PJRT_TopologyDescription_Attributes(&at), "PJRT_TopologyDescription_Attributes");
  info.attributes = attributes_of(at.attributes, at.num_attributes);
  auto dd = PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  dd.topology = args.topology;
  check(api_->PJRT_TopologyDescription_GetDeviceDescriptions(&dd), "GetDeviceDescriptions");
  for (size_t i = 0; i < dd.num_descriptions; ++i) {
    DeviceInfo d;
    auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    id.device_description = dd.descriptions[i];
    check(api_->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");
    d.id = id.id;
    auto k = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
    k.device_description = dd.descriptions[i];
    check(api_->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
    d.kind.assign(k.device_kind, k.device_kind_size);
    auto da = PJRT_ARGS(PJRT_DeviceDescription_Attributes_Args);
    da.device_description = dd.descriptions[i];
    check(api_->PJRT_DeviceDescription_Attributes(&da), "PJRT_DeviceDescription_Attributes");
    d.attributes = attributes_of(da.attributes, da.num_attributes);
    info.devices.push_back(std::move(d));
  }
  return topo;
}

CompiledForTopology CompileOnlyPlugin::compile(const Topology& topology, const std::string& mlir_text, int replicas,
                                               int partitions, bool spmd) const {
  CompiledForTopology out;
  auto t0 = std::chrono::steady_clock::now();
  std::string options = compile_options(replicas, partitions, spmd);
  PJRT_Program program = mlir_program(mlir_text);
  auto args = PJRT_ARGS(PJRT_Compile_Args);
  args.topology = topology.get();
  args.program = &program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  args.client = nullptr;  // compile only: no client, no device
  check(api_->PJRT_Compile(&args), "compile for the topology");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PJRT_Executable* exe = args.executable;
  ExecutableRelease release{api_, exe};

  auto ms = PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  ms.executable = exe;
  check(api_->PJRT_Executable_GetCompiledMemoryStats(&ms), "GetCompiledMemoryStats");
  out.memory = {{"generated_code_bytes", ms.generated_code_size_in_bytes},
                {"argument_bytes", ms.argument_size_in_bytes},
                {"output_bytes", ms.output_size_in_bytes},
                {"alias_bytes", ms.alias_size_in_bytes},
                {"temp_bytes", ms.temp_size_in_bytes},
                {"host_generated_code_bytes", ms.host_generated_code_size_in_bytes},
                {"host_argument_bytes", ms.host_argument_size_in_bytes},
                {"host_output_bytes", ms.host_output_size_in_bytes},
                {"host_temp_bytes", ms.host_temp_size_in_bytes},
                {"peak_bytes", ms.peak_memory_in_bytes},
                {"total_bytes", ms.total_size_in_bytes}};

  auto ca = PJRT_ARGS(PJRT_Executable_GetCostAnalysis_Args);
  ca.executable = exe;
  check(api_->PJRT_Executable_GetCostAnalysis(&ca), "GetCostAnalysis");
  for (size_t i = 0; i < ca.num_properties; ++i) {
    const PJRT_NamedValue& v = ca.properties[i];
    std::string key(v.name, v.name_size);
    if (v.type == PJRT_NamedValue_kFloat) out.cost[key] = v.float_value;
    else if (v.type == PJRT_NamedValue_kInt64) out.cost[key] = static_cast<double>(v.int64_value);
  }

  auto op = PJRT_ARGS(PJRT_Executable_OptimizedProgram_Args);
  auto prog = PJRT_ARGS(PJRT_Program);
  op.executable = exe;
  op.program = &prog;
  check(api_->PJRT_Executable_OptimizedProgram(&op), "OptimizedProgram (size)");
  out.optimized_program.resize(prog.code_size);
  prog.code = out.optimized_program.data();
  check(api_->PJRT_Executable_OptimizedProgram(&op), "OptimizedProgram");
  out.optimized_format.assign(prog.format, prog.format_size);

  auto ser = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  ser.executable = exe;
  check(api_->PJRT_Executable_Serialize(&ser), "Serialize");
  out.serialized.assign(ser.serialized_bytes, ser.serialized_bytes_size);
  if (ser.serialized_executable_deleter) ser.serialized_executable_deleter(ser.serialized_executable);
  return out;
}

}  // namespace torch_pjrt::runtime
