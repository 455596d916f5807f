// Programs that run on several devices at once (collectives), and the
// distributed client whose devices span processes.
#include <algorithm>
#include <stdexcept>

#include "runtime/pjrt_runtime.h"
#include "runtime/pjrt_util.h"
#include "runtime/proto_writer.h"

namespace torch_pjrt::runtime {
namespace {

// CompileOptionsProto{executable_build_options (3): {num_replicas (4),
// num_partitions (5) = 1, device_assignment (9): DeviceAssignmentProto{
// replica_count (1), computation_count (2) = 1, computation_devices (3):
// {replica_device_ids (1), packed}}}}.
std::string replicated_options(const std::vector<int64_t>& ids) {
  std::string packed;
  for (int64_t id : ids) proto::varint(packed, static_cast<uint64_t>(id));
  std::string computation;
  proto::field_bytes(computation, 1, packed);
  std::string assignment;
  proto::field_varint(assignment, 1, ids.size());
  proto::field_varint(assignment, 2, 1);
  proto::field_bytes(assignment, 3, computation);
  std::string build;
  proto::field_varint(build, 4, ids.size());
  proto::field_varint(build, 5, 1);
  proto::field_bytes(build, 9, assignment);
  std::string options;
  proto::field_bytes(options, 3, build);
  return options;
}

}  // namespace

std::vector<Runtime::GlobalDevice> Runtime::global_devices() const {
  auto all = PJRT_ARGS(PJRT_Client_Devices_Args);
  all.client = client_;
  check(api_->PJRT_Client_Devices(&all), "PJRT_Client_Devices");
  std::vector<GlobalDevice> out;
  for (size_t i = 0; i < all.num_devices; ++i) {
    auto gd = PJRT_ARGS(PJRT_Device_GetDescription_Args);
    gd.device = all.devices[i];
    check(api_->PJRT_Device_GetDescription(&gd), "PJRT_Device_GetDescription");
    auto id = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
    id.device_description = gd.device_description;
    check(api_->PJRT_DeviceDescription_Id(&id), "PJRT_DeviceDescription_Id");
    auto pi = PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args);
    pi.device_description = gd.device_description;
    check(api_->PJRT_DeviceDescription_ProcessIndex(&pi), "PJRT_DeviceDescription_ProcessIndex");
    GlobalDevice g;
    g.id = id.id;
    g.process = pi.process_index;
    for (size_t d = 0; d < devices_.size(); ++d)
      if (devices_[d] == all.devices[i]) g.local = static_cast<int>(d);
    out.push_back(g);
  }
  return out;
}

int64_t Runtime::global_id(int device) const {
  check_device(device);
  for (const GlobalDevice& g : global_devices())
    if (g.local == device) return g.id;
  throw std::runtime_error("torch_pjrt: tpu:" + std::to_string(device) + " is not among plugin '" + info_.name +
                           "''s devices");
}

ExecutablePtr Runtime::compile_replicated(const std::string& mlir_text, const std::vector<int64_t>& ids) {
  return wrap(compile_with(mlir_text, replicated_options(ids), "compile (replicated)"));
}

std::vector<std::vector<BufferPtr>> Runtime::execute_replicated(const Executable& exe, const std::vector<int>& devices,
                                                                const std::vector<std::vector<BufferPtr>>& args) {
  // The plugin takes the argument lists in the order of the executable's
  // addressable devices.
  auto ad = PJRT_ARGS(PJRT_LoadedExecutable_AddressableDevices_Args);
  ad.executable = exe.get();
  check(api_->PJRT_LoadedExecutable_AddressableDevices(&ad), "PJRT_LoadedExecutable_AddressableDevices");
  // One device of several (each participant launches its own part, as
  // separate processes do): execute_device says which.
  bool part = devices.size() == 1 && ad.num_addressable_devices > 1;
  size_t n = part ? 1 : ad.num_addressable_devices;
  if (n != devices.size() || args.size() != n)
    raise(ErrorKind::Runtime, "torch_pjrt: a replicated program runs on " + std::to_string(n) +
                                  " device(s) of this process, launched with " + std::to_string(devices.size()));
  std::vector<size_t> slot(n);  // slot[k]: index into `devices` of launched device k
  for (size_t k = 0; k < n; ++k) {
    PJRT_Device* want = part ? devices_.at(devices[0]) : ad.addressable_devices[k];
    size_t i = 0;
    while (i < n && devices_.at(devices[i]) != want) ++i;
    bool ours = !part || std::find(ad.addressable_devices, ad.addressable_devices + ad.num_addressable_devices,
                                   want) != ad.addressable_devices + ad.num_addressable_devices;
    if (i == n || !ours)
      raise(ErrorKind::Runtime, "torch_pjrt: a replicated program's device is not among those launched");
    slot[k] = i;
  }
  for (size_t i = 0; i < n; ++i) ensure_fits(devices[i], exe.total_output_bytes(), "the collective");
  size_t num_args = args[0].size();
  std::vector<std::vector<PJRT_Buffer*>> arg_lists(n, std::vector<PJRT_Buffer*>(num_args));
  std::vector<PJRT_Buffer* const*> arg_ptrs(n);
  std::vector<std::vector<PJRT_Buffer*>> outputs(n, std::vector<PJRT_Buffer*>(exe.num_outputs(), nullptr));
  std::vector<PJRT_Buffer**> out_ptrs(n);
  std::vector<PJRT_Event*> done(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    const auto& a = args[slot[k]];
    if (a.size() != num_args) raise(ErrorKind::Runtime, "torch_pjrt: replicated launch with uneven argument lists");
    for (size_t j = 0; j < num_args; ++j) arg_lists[k][j] = a[j]->get();
    arg_ptrs[k] = arg_lists[k].data();
    out_ptrs[k] = outputs[k].data();
  }
  auto options = PJRT_ARGS(PJRT_ExecuteOptions);
  auto ex = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  ex.executable = exe.get();
  ex.options = &options;
  ex.argument_lists = arg_ptrs.data();
  ex.num_devices = n;
  ex.num_args = num_args;
  ex.output_lists = out_ptrs.data();
  ex.device_complete_events = done.data();
  // Null: every device of ours the program was compiled for.
  ex.execute_device = part ? devices_.at(devices[0]) : nullptr;
  check(api_->PJRT_LoadedExecutable_Execute(&ex), "execute (replicated)");
  metrics().executions++;
  std::vector<std::vector<BufferPtr>> result(n);
  for (size_t k = 0; k < n; ++k) {
    int device = devices[slot[k]];
    auto& outs = result[slot[k]];
    for (size_t j = 0; j < outputs[k].size(); ++j)
      outs.push_back(std::make_shared<Buffer>(api_, outputs[k][j], device, exe.output_bytes(j)));
    std::vector<BufferPtr> held = args[slot[k]];
    held.insert(held.end(), outs.begin(), outs.end());
    enqueue(device, done[k], QueueHold(std::move(held)));
  }
  return result;
}

void Runtime::make_distributed(int node_id, int num_nodes, KeyValueStorePtr kv) {
  if (num_nodes_ > 1) {
    if (node_id == node_id_ && num_nodes == num_nodes_) return;
    throw std::runtime_error("torch_pjrt: the PJRT client is already node " + std::to_string(node_id_) + " of " +
                             std::to_string(num_nodes_) + "; it cannot become node " + std::to_string(node_id) +
                             " of " + std::to_string(num_nodes));
  }
  std::string used;
  auto& m = metrics();
  if (m.executions > 0) used = std::to_string(m.executions.load()) + " program(s) already ran";
  else if (m.xla_compiles > 0 || m.persistent_cache_hits > 0) used = "programs were already compiled";
  else if (m.host_to_device_bytes > 0) used = "tensors were already moved to the device";
  for (int d = 0; used.empty() && d < device_count(); ++d)
    if (live_bytes(d) > 0) used = "tpu:" + std::to_string(d) + " already holds tensors";
  if (!used.empty())
    throw std::runtime_error("torch_pjrt: cannot make plugin '" + info_.name +
                             "''s client span processes: " + used +
                             " on the client made at import; call init_process_group before using tpu tensors");
  int old_count = device_count();
  auto destroy = PJRT_ARGS(PJRT_Client_Destroy_Args);
  destroy.client = client_;
  check(api_->PJRT_Client_Destroy(&destroy), "PJRT_Client_Destroy");
  client_ = nullptr;
  kv_ = std::move(kv);
  try {
    create_client(kv_.get(), node_id, num_nodes);
  } catch (...) {
    // Back to a client of this process alone, so the device stays usable.
    kv_.reset();
    create_client(nullptr, 0, 1);
    throw;
  }
  node_id_ = node_id;
  num_nodes_ = num_nodes;
  if (device_count() != old_count)
    throw std::runtime_error("torch_pjrt: plugin '" + info_.name + "''s distributed client has " +
                             std::to_string(device_count()) + " local device(s), the client made at import had " +
                             std::to_string(old_count));
}

}  // namespace torch_pjrt::runtime
