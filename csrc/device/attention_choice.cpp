// Which kernel F.scaled_dot_product_attention uses on tpu. PyTorch asks the
// device's _fused_sdp_choice stub; "overrideable" sends the call to
// _scaled_dot_product_fused_attention_overrideable (and its backward), which
// lower to one program each (ops/attention.cpp). Shapes that lowering does not
// take (grouped-query heads, ranks other than 4) use PyTorch's math decomposition.
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

namespace at::native {
namespace {

int64_t tpu_sdp_choice(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
                       double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  // The math path where the user turned the overrideable kernel off
  // (sdpa_kernel([SDPBackend.MATH])) and under vmap (the fused op has no
  // batching rule; the math decomposition batches). Under vmap(grad(f))
  // (per-sample gradients) the tensors seen here are grad wrappers of batched
  // ones, which raised "Batching rule not implemented": any functorch
  // wrapper takes the math path (the vmap level under a grad wrapper is not
  // visible here without functorch's internal headers).
  auto wrapped = [](const Tensor& t) {
    return t.key_set().has(c10::DispatchKey::FuncTorchBatched) ||
           t.key_set().has(c10::DispatchKey::FuncTorchGradWrapper);
  };
  bool batched = wrapped(q) || wrapped(k) || wrapped(v);
  bool fused = at::globalContext().userEnabledOverrideableSDP() && !batched && !enable_gqa && q.dim() == 4 && k.dim() == 4 && v.dim() == q.dim() &&
               at::isFloatingType(q.scalar_type()) && k.scalar_type() == q.scalar_type() &&
               v.scalar_type() == q.scalar_type() && !(is_causal && mask.has_value() && mask->defined());
  // (The op's Meta kernel takes 4-d [batch, heads, seq, dim] only, and checks
  // none of the sizes below.) Symbolic sizes under torch.compile: compare
  // sizes with each other (an equality guard); size() would specialize every
  // dim, sequence length included, to this call's value. Batches that
  // broadcast, and mismatched key/value lengths or query/key widths, take the
  // math path: PyTorch's broadcasting and its errors.
  if (fused)
    fused = q.sym_size(1) == k.sym_size(1) && k.sym_size(1) == v.sym_size(1) && q.sym_size(0) == k.sym_size(0) &&
            k.sym_size(0) == v.sym_size(0) && k.sym_size(2) == v.sym_size(2) && q.sym_size(3) == k.sym_size(3);
  return static_cast<int64_t>(fused ? at::SDPBackend::overrideable : at::SDPBackend::math);
}

}  // namespace

REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tpu_sdp_choice)

// torch._fused_sdp_choice on tpu tensors answers what SDPA will do on tpu
// (without it the op ran on CPU's kernel through the fallback: CPU's choice).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_fused_sdp_choice", &tpu_sdp_choice); }

}  // namespace at::native
