// Meta kernels PyTorch lacks for ops that tpu runs through a lowering: the
// executor plans every op from its Meta kernel (result shapes and dtypes).
// (Registered for the Meta key: FakeTensor and torch.compile get them too.)
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
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

// _native_batch_norm_legit.out / .no_stats_out: the functional form's Meta
// results, the out= tensors resized to them (as CPU's out= kernels do).
using Outs3 = std::tuple<at::Tensor&, at::Tensor&, at::Tensor&>;
Outs3 resized(const std::tuple<at::Tensor, at::Tensor, at::Tensor>& r, at::Tensor& out, at::Tensor& save_mean,
              at::Tensor& save_invstd) {
  at::native::resize_output(out, std::get<0>(r).sizes());
  at::native::resize_output(save_mean, std::get<1>(r).sizes());
  at::native::resize_output(save_invstd, std::get<2>(r).sizes());
  return {out, save_mean, save_invstd};
}

Outs3 batch_norm_legit_out_meta(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, at::Tensor& running_mean,
                                at::Tensor& running_var, bool training, double momentum, double eps, at::Tensor& out,
                                at::Tensor& save_mean, at::Tensor& save_invstd) {
  return resized(at::_native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps),
                 out, save_mean, save_invstd);
}

Outs3 batch_norm_legit_no_stats_out_meta(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                         const std::optional<at::Tensor>& bias, bool training, double momentum,
                                         double eps, at::Tensor& out, at::Tensor& save_mean, at::Tensor& save_invstd) {
  return resized(at::_native_batch_norm_legit(input, weight, bias, training, momentum, eps), out, save_mean,
                 save_invstd);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_native_batch_norm_legit.out", batch_norm_legit_out_meta);
  m.impl("_native_batch_norm_legit.no_stats_out", batch_norm_legit_no_stats_out_meta);
  m.impl("mish_backward", mish_backward_meta);
  m.impl("_transform_bias_rescale_qkv", transform_bias_rescale_qkv_meta);
  m.impl("_masked_softmax", masked_softmax_meta);
}

}  // namespace torch_pjrt::device
