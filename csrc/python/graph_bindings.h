#pragma once

#include <pybind11/pybind11.h>

namespace torch_pjrt::python {
// GraphProgram, CompiledGraph and find_lowering, for the torch.compile frontend.
void bind_graph(pybind11::module& m);
}  // namespace torch_pjrt::python
