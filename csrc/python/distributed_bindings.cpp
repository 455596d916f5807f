#include "python/distributed_bindings.h"

#include <torch/csrc/utils/pybind.h>

#include "distributed/host_backend.h"

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
    return d;
  });
}

}  // namespace torch_pjrt::python
