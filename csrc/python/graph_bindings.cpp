// Python bindings of the graph frontend (csrc/graph): the FX-graph walker in
// torch_pjrt/_compile/lower_graph.py builds a GraphProgram node by node.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "device/dtype_map.h"
#include "distributed/collective_programs.h"
#include "eager/plan.h"
#include "graph/graph_program.h"
#include "python/graph_bindings.h"

namespace py = pybind11;

namespace torch_pjrt::python {
namespace {

using lowering::Arg;
using lowering::DType;
using lowering::TensorType;

lowering::StridedView strided(const py::tuple& t) {
  return lowering::StridedView{t[0].cast<std::vector<int64_t>>(), t[1].cast<std::vector<int64_t>>(),
                               t[2].cast<int64_t>()};
}

lowering::Scalar number(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return lowering::Scalar::from_bool(v.cast<bool>());
  if (py::isinstance<py::int_>(v)) {
    // [2**63, 2**64): a uint64 Scalar, as PyTorch takes it (outside both: cast's error).
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow > 0) return lowering::Scalar::from_uint(v.cast<uint64_t>());
    return lowering::Scalar::from_int(v.cast<int64_t>());
  }
  return lowering::Scalar::from_float(v.cast<double>());
}

// (name, kind, payload) from the walker -> the registry's Arg. Kinds: none, t
// (value id), tn (value id, not contiguous), wn (a Python number passed as a Tensor), cn (a
// Python complex, (real, imag)), tl, otl, i, f, b, il,
// fl, s, dt, other; dwn / di: a Python int the program takes at run time
// ((value, value id)), as a wrapped number / a scalar argument.
Arg to_arg(graph::GraphProgram& prog, const py::tuple& spec) {
  Arg a;
  a.name = spec[0].cast<std::string>();
  std::string kind = spec[1].cast<std::string>();
  py::handle p = spec[2];
  if (kind == "none") {
    a.kind = Arg::None;
  } else if (kind == "t" || kind == "tn") {  // tn: a tensor that is not contiguous
    a.kind = Arg::Tensor;
    a.contiguous = kind == "t";
    a.tensor = prog.value(p.cast<int>());
  } else if (kind == "wn") {
    lowering::Scalar s = number(p);
    a.kind = Arg::Tensor;
    a.wrapped_number = true;
    a.scalar = s;  // (for check_scalar_fits)
    a.tensor = prog.builder().constant(s, s.natural_dtype());
  } else if (kind == "dwn" || kind == "di") {
    // A Python int the program takes at run time, (value, value id of a 0-d
    // s64): as a wrapped number in a Tensor argument, or a scalar argument
    // (this call's value kept; a lowering that reads it is told: read_dynamic).
    auto pair = p.cast<py::tuple>();
    if (kind == "dwn") {
      a.kind = Arg::Tensor;
      a.wrapped_number = true;
      a.tensor = prog.value(pair[1].cast<int>());
    } else {
      a.kind = Arg::Int;
      a.scalar = number(pair[0]);
      a.dynamic = prog.value(pair[1].cast<int>());
    }
  } else if (kind == "cn") {  // a Python complex (real, imag): wrapped, as PyTorch takes it
    lowering::Builder& b = prog.builder();
    auto parts = p.cast<std::pair<double, double>>();
    a.kind = Arg::Tensor;
    a.wrapped_number = true;
    a.tensor = b.op("stablehlo.complex",
                    {b.constant(lowering::Scalar::from_float(parts.first), lowering::DType::F64),
                     b.constant(lowering::Scalar::from_float(parts.second), lowering::DType::F64)},
                    TensorType{lowering::DType::C128, {}});
  } else if (kind == "tl") {
    a.kind = Arg::TensorList;
    for (auto id : p) a.tensors.push_back(prog.value(id.cast<int>()));
  } else if (kind == "otl") {
    a.kind = Arg::OptTensorList;
    for (auto id : p)
      a.opt_tensors.push_back(id.is_none() ? std::nullopt : std::optional<lowering::Value>(prog.value(id.cast<int>())));
  } else if (kind == "i" || kind == "f" || kind == "b") {
    a.scalar = number(p);
    a.kind = a.scalar.kind == lowering::Scalar::Float ? Arg::Float
             : a.scalar.kind == lowering::Scalar::Bool ? Arg::Bool
                                                       : Arg::Int;
  } else if (kind == "il") {
    a.kind = Arg::IntList;
    for (auto v : p) a.ints.push_back(v.cast<int64_t>());
  } else if (kind == "fl") {
    a.kind = Arg::FloatList;
    for (auto v : p) a.floats.push_back(v.cast<double>());
  } else if (kind == "s") {
    a.kind = Arg::String;
    a.str = p.cast<std::string>();
  } else if (kind == "dt") {
    a.kind = Arg::ScalarType;
    a.dtype = device::to_dtype(p.cast<at::ScalarType>());
  } else if (kind == "other") {
    a.kind = Arg::Other;
  } else {
    throw std::invalid_argument("torch_pjrt: unknown graph argument kind '" + kind + "'");
  }
  return a;
}

std::optional<TensorType> tensor_type(const py::handle& spec) {
  if (spec.is_none()) return std::nullopt;
  auto t = spec.cast<py::tuple>();
  return TensorType{device::to_dtype(t[0].cast<at::ScalarType>()), t[1].cast<std::vector<int64_t>>()};
}

}  // namespace

void bind_graph(py::module& m) {
  using graph::GraphProgram;
  py::class_<GraphProgram>(m, "GraphProgram")
      .def(py::init<>())
      .def("input", [](GraphProgram& g, int index, py::tuple type) { return g.input(index, *tensor_type(type)); })
      .def("input_view", &GraphProgram::input_view)
      .def("cpu_inputs",
           [](GraphProgram& g, const py::list& inputs) {
             std::vector<std::pair<int, TensorType>> in;
             for (auto e : inputs) {
               auto t = e.cast<py::tuple>();
               in.emplace_back(t[0].cast<int>(), *tensor_type(t[1]));
             }
             return g.cpu_inputs(in);
           })
      .def("call",
           [](GraphProgram& g, const std::string& name, const std::string& overload, const py::list& args,
              const py::list& outputs, std::optional<int> rng) {
             std::vector<Arg> converted;
             for (auto a : args) converted.push_back(to_arg(g, a.cast<py::tuple>()));
             std::vector<std::optional<TensorType>> outs;
             for (auto o : outputs) outs.push_back(tensor_type(o));
             auto r = g.call(name, overload, std::move(converted), outs, rng);
             return py::make_tuple(r.results, r.mutations, r.read_dynamic);
           },
           py::arg("name"), py::arg("overload"), py::arg("args"), py::arg("outputs"), py::arg("rng") = py::none())
      .def("rng_key", &GraphProgram::rng_key)
      .def("view",
           [](GraphProgram& g, int base, py::tuple base_view, py::tuple out_view, at::ScalarType dtype,
              std::optional<int> shift) {
             return g.view(base, strided(base_view), strided(out_view), device::to_dtype(dtype), shift);
           },
           py::arg("base"), py::arg("base_view"), py::arg("out_view"), py::arg("dtype"), py::arg("shift") = py::none())
      .def("view_scatter",
           [](GraphProgram& g, int base, py::tuple base_view, py::tuple out_view, int src, std::optional<int> shift) {
             return g.view_scatter(base, strided(base_view), strided(out_view), src, shift);
           },
           py::arg("base"), py::arg("base_view"), py::arg("out_view"), py::arg("src"), py::arg("shift") = py::none())
      .def("convert",
           [](GraphProgram& g, int id, at::ScalarType dtype, std::vector<int64_t> shape) {
             auto& b = g.builder();
             lowering::Value v = b.convert(g.value(id), device::to_dtype(dtype));
             if (v.shape() != shape) v = b.broadcast_to(v, shape);
             return g.add(v);
           })
      .def("constant",
           [](GraphProgram& g, py::handle value, at::ScalarType dtype) {
             return g.add(g.builder().constant(number(value), device::to_dtype(dtype)));
           })
      .def("type", [](GraphProgram& g, int id) {
        const auto& t = g.value(id).type;
        return py::make_tuple(device::to_scalar_type(t.dtype), t.shape);
      })
      // A collective over `ranks` replicas (replica r = group rank r) on
      // value `id`: the graph becomes a replicated program (docs/distributed.md).
      .def("collective",
           [](GraphProgram& g, const std::string& kind, const std::string& reduction, int id, int ranks, int root) {
             distributed::CollectiveSpec spec;
             spec.kind = distributed::collective_from_name(kind);
             spec.reduction = distributed::reduction_from_name(reduction);
             spec.ranks = ranks;
             spec.root = root;
             auto& b = g.builder();
             TORCH_CHECK_VALUE(b.replicas() == 0 || b.replicas() == ranks, "torch_pjrt: a compiled graph with ",
                               "collectives over ", b.replicas(), " and ", ranks, " ranks");
             b.set_replicas(ranks);
             return g.add(distributed::emit_collective(b, spec, g.value(id)));
           })
      // Control flow: regions of stablehlo.if / while (GraphProgram::open_region).
      .def("open_region",
           [](GraphProgram& g, const py::list& types, bool loop) {
             std::vector<TensorType> t;
             for (auto e : types) t.push_back(*tensor_type(e));
             return g.open_region(t, loop);
           })
      .def("close_region", &GraphProgram::close_region)
      // A scan's loop: its counter (0-d s64) against the length, the next
      // counter, and the slice at the counter of dim 0 read and written.
      .def("index_below",
           [](GraphProgram& g, int i, int64_t n) {
             auto& b = g.builder();
             return g.add(b.compare(lowering::Cmp::LT, g.value(i), b.constant_int(n, DType::I64)));
           })
      .def("index_next",
           [](GraphProgram& g, int i) {
             auto& b = g.builder();
             return g.add(b.binary("add", g.value(i), b.constant_int(1, DType::I64)));
           })
      .def("slice_at",
           [](GraphProgram& g, int x, int i) {
             auto& b = g.builder();
             const lowering::Value& v = g.value(x);
             std::vector<lowering::Value> start{g.value(i)};
             lowering::Shape sizes = v.shape(), rest(v.shape().begin() + 1, v.shape().end());
             sizes[0] = 1;
             for (size_t d = 1; d < sizes.size(); ++d) start.push_back(b.constant_int(0, DType::I64));
             return g.add(b.reshape(b.dynamic_slice(v, start, sizes), rest));
           })
      .def("update_at",
           [](GraphProgram& g, int acc, int y, int i) {
             auto& b = g.builder();
             const lowering::Value& a = g.value(acc);
             std::vector<lowering::Value> start{g.value(i)};
             lowering::Shape one = a.shape();
             one[0] = 1;
             for (size_t d = 1; d < one.size(); ++d) start.push_back(b.constant_int(0, DType::I64));
             return g.add(b.dynamic_update_slice_at(a, b.reshape(g.value(y), one), start));
           })
      .def("if_op", &GraphProgram::if_op)
      .def("while_op", &GraphProgram::while_op)
      .def("finish", &GraphProgram::finish)
      .def("num_params", [](GraphProgram& g) { return g.params().size(); })
      // Per program parameter: (kind, graph input index or -1); readiness
      // annotates shardings from it.
      .def("param_sources", [](GraphProgram& g) {
        static const char* kKinds[] = {"input", "rng", "cpu_pack", "storage", "check_word", "offset"};
        py::list out;
        for (const auto& p : g.params()) out.append(py::make_tuple(kKinds[p.kind], p.input));
        return out;
      });

  py::class_<graph::CompiledGraph, std::shared_ptr<graph::CompiledGraph>>(m, "CompiledGraph")
      .def(py::init([](GraphProgram& prog, const std::string& text, const py::list& outputs,
                       const std::vector<std::pair<int, int>>& mutations, int device, const std::string& name,
                       const std::vector<int64_t>& replica_ids) {
        auto cg = std::make_shared<graph::CompiledGraph>();
        cg->replica_ids = replica_ids;
        {
          py::gil_scoped_release release;
          auto& rt = runtime::Runtime::get();
          graph::make_resident(*cg, replica_ids.empty() ? rt.compile(text) : rt.compile_replicated(text, replica_ids));
        }
        cg->params = prog.params();
        cg->check_output = prog.check_output();
        for (auto o : outputs) {
          auto t = o.cast<py::tuple>();
          graph::OutputSpec spec;
          spec.dtype = device::to_dtype(t[0].cast<at::ScalarType>());
          spec.sizes = t[1].cast<std::vector<int64_t>>();
          spec.strides = t[2].cast<std::vector<int64_t>>();
          spec.on_cpu = t[3].cast<bool>();
          spec.program_output = t[4].cast<int>();
          cg->outputs.push_back(spec);
        }
        cg->mutations = mutations;
        cg->device = device;
        // A replicated program launches its part with the other ranks'; it
        // does not join a fused trace.
        if (replica_ids.empty()) graph::prepare_fused(*cg, prog, text, name);
        return cg;
      }),
           py::arg("prog"), py::arg("text"), py::arg("outputs"), py::arg("mutations"), py::arg("device"),
           py::arg("name") = "graph", py::arg("replica_ids") = std::vector<int64_t>{})
      // Without the GIL: other Python threads run while this one waits for
      // the device lock or the device.
      .def("run", &graph::run, py::call_guard<py::gil_scoped_release>())
      .def("resident", &graph::resident);

  m.def("foreach_aliases", &eager::foreach_aliases);
  m.def("covers_storage", &graph::covers_storage);
  // The dim order of a dense (permuted contiguous) layout, or None.
  m.def("dense_permutation", [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) -> py::object {
    std::vector<int64_t> perm;
    if (sizes.size() != strides.size() || !lowering::dense_permutation(sizes, strides, &perm)) return py::none();
    return py::cast(perm);
  });
  m.def("find_lowering", [](const std::string& name, const std::string& overload) -> py::object {
    const auto* info = lowering::find_lowering(name, overload);
    if (!info) return py::none();
    return py::make_tuple(info->family, info->needs_rng);
  });
}

}  // namespace torch_pjrt::python
