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

// _transform_bias_rescale_qkv(qkv [B, T, 3D], qkv_bias, num_heads): q, k, v
// as [B, H, T, D/H] (CPU's kernel's checks are the lowering's).
std::tuple<at::Tensor, at::Tensor, at::Tensor> transform_bias_rescale_qkv_meta(const at::Tensor& qkv,
                                                                                const at::Tensor& qkv_bias,
                                                                                int64_t num_heads) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "expected qkv of shape [B, T, 3 * D], got ", qkv.sizes());
  int64_t D = qkv.size(2) / 3;
  TORCH_CHECK(num_heads > 0 && D % num_heads == 0, "D must be divisible by num_heads");
  auto make = [&] { return at::empty({qkv.size(0), num_heads, qkv.size(1), D / num_heads}, qkv.options()); };
  return {make(), make(), make()};
}

// _masked_softmax(self, mask, dim, mask_type): self's shape and dtype.
at::Tensor masked_softmax_meta(const at::Tensor& self, const at::Tensor& mask, std::optional<int64_t>,
                               std::optional<int64_t>) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "Mask should be a boolean tensor");
  return at::empty(self.sizes(), self.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("mish_backward", mish_backward_meta);
  m.impl("_transform_bias_rescale_qkv", transform_bias_rescale_qkv_meta);
  m.impl("_masked_softmax", masked_softmax_meta);
}

}  // namespace torch_pjrt::device
