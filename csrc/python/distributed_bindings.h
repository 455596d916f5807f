#pragma once

#include <pybind11/pybind11.h>

namespace torch_pjrt::python {
// The tpu device's c10d backend (host-copy path) and its counters, for
// torch_pjrt/distributed.
void bind_distributed(pybind11::module& m);
}  // namespace torch_pjrt::python
