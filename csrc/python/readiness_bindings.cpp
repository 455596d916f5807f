// Python bindings of the compile-only plugin (runtime/topology_compiler.h),
// used by torch_pjrt/readiness: compile a model's programs for a TPU topology
// on a machine with no TPU.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/readiness_bindings.h"
#include "runtime/topology_compiler.h"

namespace py = pybind11;

namespace torch_pjrt::python {
namespace {

using runtime::CompileOnlyPlugin;
using runtime::Topology;
using runtime::TopologyOption;

// {name: int | [int] | str | bool} -> named values.
std::vector<TopologyOption> options_of(const py::dict& d) {
  std::vector<TopologyOption> out;
  for (auto [k, v] : d) {
    TopologyOption o;
    o.name = k.cast<std::string>();
    if (py::isinstance<py::bool_>(v)) {
      o.kind = TopologyOption::Bool;
      o.b = v.cast<bool>();
    } else if (py::isinstance<py::int_>(v)) {
      o.i = v.cast<int64_t>();
    } else if (py::isinstance<py::str>(v)) {
      o.kind = TopologyOption::String;
      o.s = v.cast<std::string>();
    } else {
      o.kind = TopologyOption::IntList;
      o.list = v.cast<std::vector<int64_t>>();
    }
    out.push_back(std::move(o));
  }
  return out;
}

py::dict info_dict(const runtime::TopologyInfo& info) {
  py::dict d;
  d["name"] = info.name;
  d["platform"] = info.platform;
  d["platform_version"] = info.platform_version;
  d["attributes"] = info.attributes;
  py::list devices;
  for (const auto& dev : info.devices) {
    py::dict e;
    e["id"] = dev.id;
    e["kind"] = dev.kind;
    e["attributes"] = dev.attributes;
    devices.append(e);
  }
  d["devices"] = devices;
  return d;
}

}  // namespace

void bind_readiness(py::module& m) {
  py::class_<Topology, std::shared_ptr<Topology>>(m, "Topology")
      .def("info", [](const Topology& t) { return info_dict(t.info()); });
  py::class_<CompileOnlyPlugin, std::shared_ptr<CompileOnlyPlugin>>(m, "CompileOnlyPlugin")
      .def(py::init([](const std::string& path, double timeout_s) {
             py::gil_scoped_release release;
             return CompileOnlyPlugin::load(path, timeout_s);
           }),
           py::arg("path"), py::arg("timeout_s") = 120.0)
      .def("api_version", &CompileOnlyPlugin::api_version)
      .def("topology",
           [](const CompileOnlyPlugin& p, const std::string& name, const py::dict& options) {
             auto opts = options_of(options);
             py::gil_scoped_release release;
             return p.topology(name, opts);
           },
           py::arg("name"), py::arg("options") = py::dict())
      .def("compile",
           [](const CompileOnlyPlugin& p, const Topology& t, const std::string& text, int replicas, int partitions,
              bool spmd) {
             runtime::CompiledForTopology r;
             {
               py::gil_scoped_release release;
               r = p.compile(t, text, replicas, partitions, spmd);
             }
             py::dict d;
             d["memory"] = r.memory;
             d["cost"] = r.cost;
             d["optimized_program"] = py::bytes(r.optimized_program);
             d["optimized_format"] = r.optimized_format;
             d["serialized"] = py::bytes(r.serialized);
             d["seconds"] = r.seconds;
             return d;
           },
           py::arg("topology"), py::arg("text"), py::arg("replicas") = 1, py::arg("partitions") = 1,
           py::arg("spmd") = false);
  m.def("tpu_present", &runtime::tpu_present);
}

}  // namespace torch_pjrt::python
