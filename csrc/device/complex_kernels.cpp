// Complex views on tpu: view_as_real / view_as_complex are ATen's own
// device-independent kernels (a view of the same storage with the other dtype),
// so writes through either are seen by the other; .real / .imag follow.
#include <ATen/ATen.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
}
