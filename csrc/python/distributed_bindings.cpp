#include "python/distributed_bindings.h"

#include <torch/csrc/utils/pybind.h>

#include "device/dtype_map.h"

#include "distributed/collective_programs.h"
#include "distributed/device_backend.h"
#include "distributed/host_backend.h"
#include "distributed/store_kv.h"
#include "eager/fused.h"
#include "runtime/pjrt_runtime.h"

namespace py = pybind11;

namespace torch_pjrt::python {

void bind_distributed(py::module& m) {
  // Returned as torch's own c10d Backend type (registered by
  // torch.distributed), so ProcessGroup._register_backend takes it.
  m.def("host_copy_backend", [](c10::intrusive_ptr<c10d::Backend> host) {
    return c10::intrusive_ptr<c10d::Backend>(
        c10::make_intrusive<distributed::HostCopyBackend>(std::move(host)));
  });
  m.def("distributed_metrics", [] {
    auto& c = distributed::host_counters();
    py::dict d;
    d["distributed_host_collectives"] = c.collectives.load();
    d["distributed_to_host_bytes"] = c.to_host_bytes.load();
    d["distributed_from_host_bytes"] = c.from_host_bytes.load();
    d["distributed_device_collectives"] = distributed::device_collectives().load();
    return d;
  });
  m.def(
      "device_backend",
      [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::intrusive_ptr<c10d::Backend> fallback,
         int64_t timeout_ms) {
        return c10::intrusive_ptr<c10d::Backend>(c10::make_intrusive<distributed::DeviceBackend>(
            std::move(store), rank, size, std::move(fallback), std::chrono::milliseconds(timeout_ms)));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("fallback"), py::arg("timeout_ms") = 0);
  // The group's devices (global ids by rank) when `backend` runs collectives
  // on the device; None for any other backend.
  m.def("device_backend_ids", [](c10::intrusive_ptr<c10d::Backend> backend, int device) -> py::object {
    auto* d = dynamic_cast<distributed::DeviceBackend*>(backend.get());
    if (!d) return py::none();
    std::vector<int64_t> ids;
    {
      py::gil_scoped_release release;  // may wait for the other ranks' ids in the store
      ids = d->ids(device);
    }
    return py::cast(ids);
  });
  // The client spans processes from now on; `store` is the job's (keys under it are the plugin's).
  m.def("make_distributed_client", [](c10::intrusive_ptr<c10d::Store> store, int node_id, int num_nodes) {
    py::gil_scoped_release release;  // the plugin waits on the other processes through the store
    eager::fused_flush("synchronize");  // tensors fused eager has only recorded exist too (and make it refuse)
    runtime::Runtime::get().make_distributed(node_id, num_nodes, distributed::store_as_kv(std::move(store)));
  });
  m.def("client_node", [] { return runtime::Runtime::get().node(); });
  m.def("global_devices", [] {
    py::list out;
    for (const auto& g : runtime::Runtime::get().global_devices()) {
      py::dict d;
      d["id"] = g.id;
      d["process"] = g.process;
      d["local"] = g.local;
      out.append(d);
    }
    return out;
  });
  m.def("run_collective_locally", [](const std::string& kind, const std::vector<at::Tensor>& inputs,
                                     const std::string& reduction, int root) {
    TORCH_CHECK_VALUE(!inputs.empty(), "torch_pjrt: a collective needs inputs");
    distributed::CollectiveSpec s;
    s.kind = distributed::collective_from_name(kind);
    s.reduction = distributed::reduction_from_name(reduction);
    s.dtype = device::to_dtype(inputs[0].scalar_type());
    s.numel = inputs[0].numel();
    s.ranks = static_cast<int>(inputs.size());
    s.root = root;
    return distributed::run_collective_locally(s, inputs);
  });
  m.def("collective_program", [](const std::string& kind, int64_t numel, int ranks) {
    distributed::CollectiveSpec s;
    s.kind = distributed::collective_from_name(kind);
    s.numel = numel;
    s.ranks = ranks;
    return distributed::collective_program(s);
  });
  // The PJRT key-value callbacks over `store`, called as a plugin calls them.
  m.def("kv_callback", [](c10::intrusive_ptr<c10d::Store> store, const std::string& op, const std::string& key,
                          const std::string& value, int timeout_ms) {
    auto kv = distributed::store_as_kv(std::move(store));
    std::string out;
    {
      py::gil_scoped_release release;
      out = runtime::call_kv_callback(kv.get(), op, key, value, timeout_ms);
    }
    return py::bytes(out);
  });
}

}  // namespace torch_pjrt::python
