// The inference fast paths of nn.MultiheadAttention and
// nn.TransformerEncoderLayer (eval, no_grad): _native_multi_head_attention and
// _transformer_encoder_layer_fwd. PyTorch's CPU implementations are
// compositions of ATen ops (linear, _transform_bias_rescale_qkv, SDPA or
// _masked_softmax, layer_norm), so on tpu they run as they are, op by op on
// the device; without these the CPU fallback copied every weight to the
// host on every call.
#include <ATen/ATen.h>
#include <ATen/ops/_native_multi_head_attention_native.h>
#include <ATen/ops/_transformer_encoder_layer_fwd_native.h>
#include <torch/library.h>

namespace torch_pjrt::device {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", at::native::native_multi_head_attention_cpu);
  m.impl("_transformer_encoder_layer_fwd", at::native::transformer_encoder_layer_forward);
}

}  // namespace torch_pjrt::device
