#pragma once

#include <pybind11/pybind11.h>

namespace torch_pjrt::python {
// CompileOnlyPlugin and Topology, for torch_pjrt.readiness.
void bind_readiness(pybind11::module& m);
}  // namespace torch_pjrt::python
