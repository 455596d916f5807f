// Meta kernels PyTorch lacks for ops that tpu runs through a lowering: the
// executor plans every op from its Meta kernel (result shapes and dtypes).
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

namespace torch_pjrt::device {
namespace {

// mish_backward(grad_output, self): CPU's TensorIterator binary op (broadcast).
at::Tensor mish_backward_meta(const at::Tensor& grad_output, const at::Tensor& self) {
  return at::empty(at::infer_size(grad_output.sizes(), self.sizes()), self.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) { m.impl("mish_backward", mish_backward_meta); }

}  // namespace torch_pjrt::device
