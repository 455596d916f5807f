// Sparse layouts and quantized tensors on tpu: not supported. Every op reaching the SparsePrivateUse1
// key raises NotImplementedError (as PyTorch does for a missing kernel) with
// what a user hits it through and what to do instead, rather than PyTorch's
// generic "could not run ... with arguments from the 'Sparsetpu' backend".
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace torch_pjrt::device {
namespace {

void no_sparse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: sparse tensors are not supported on device tpu (", op.schema().name(),
                              "). nn.Embedding(sparse=True), nn.EmbeddingBag(sparse=True) and "
                              "torch.gather(sparse_grad=True) make one for their gradient: use sparse=False "
                              "(a dense gradient) on tpu.");
}

void no_quantized(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_pjrt: quantized tensors are not supported on device tpu (",
                              op.schema().name(), "). Keep quantized tensors on the CPU, or dequantize() "
                              "before moving them to tpu.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&no_quantized>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&no_sparse>()); }
// CSR/CSC/BSR/BSC: the same (they were made, and then nothing but the
// dispatcher's generic error could use them).
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&no_sparse>());
}

}  // namespace torch_pjrt::device
