#pragma once

#include <pybind11/pybind11.h>

namespace torch_pjrt::python {
// Step capture (torch_pjrt.capture_step): record, compare and replay.
void bind_capture(pybind11::module& m);
}  // namespace torch_pjrt::python
