// `param.data = tensor` between a CPU and a tpu tensor, as between CPU and
// CUDA. Variable::set_data asks _has_compatible_shallow_copy_type, whose
// stock answer (TensorImpl::has_compatible_shallow_copy_type) lists the dense
// backends CPU, CUDA, MPS, HIP, XPU, HPU and MTIA but not PrivateUse1, so
// `p.data = p.to("tpu")` raised "incompatible tensor type" (FSDP2's
// fully_shard moves parameters that way, and so does much user code).
// PyTorch's note there invites a PrivateUse1 backend to register this op.
// Our tensors are plain TensorImpls over plain StorageImpls, so a shallow
// copy between them and CPU's is what it is between CUDA's and CPU's.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace torch_pjrt::device {
namespace {

bool dense(c10::DispatchKeySet ks) {
  constexpr auto backends = c10::DispatchKeySet(
      {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
       c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
       c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self.key_set()) && dense(from.key_set()));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

}  // namespace torch_pjrt::device
