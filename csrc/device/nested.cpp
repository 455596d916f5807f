// Nested tensors (torch.nested, strided layout) on tpu. Their buffer is a tpu
// storage; ops on them run on the CPU (PyTorch's nested kernels) through the
// CPU fallback, since no lowering takes ragged shapes. What makes that work:
// a copy between devices that keeps the nested layout, and the fallback on
// the NestedTensorPrivateUse1 key. nn.TransformerEncoder's inference fast
// path (eval, no_grad, a padding mask) builds one on any supported device.
#include <ATen/ATen.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "device/lowering_routes.h"
#include "eager/cpu_fallback.h"
#include "eager/fused.h"
#include "eager/ivalue_tensors.h"

namespace torch_pjrt::device {
namespace {

// The storage copied as it is (its sizes, strides and offsets kept), to the
// device and dtype asked for.
at::Tensor nested_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                          std::optional<at::Layout> layout, std::optional<at::Device> device,
                          std::optional<bool> /*pin_memory*/, bool non_blocking,
                          std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == at::kStrided, "torch_pjrt: a nested tensor on tpu converts to the strided "
              "nested layout only, not ", *layout);
  TORCH_CHECK(!memory_format || *memory_format == at::MemoryFormat::Preserve ||
                  *memory_format == at::MemoryFormat::Contiguous,
              "torch_pjrt: nested tensors take memory_format preserve or contiguous only");
  const at::native::NestedTensorImpl* impl = at::native::get_nested_tensor_impl(self);
  at::Tensor storage = impl->get_unsafe_storage_as_tensor();
  at::Tensor moved = storage.to(storage.options().device(device.value_or(self.device()))
                                    .dtype(dtype.value_or(self.scalar_type())),
                                non_blocking, /*copy=*/true);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      moved, impl->get_nested_sizes().clone(), impl->get_nested_strides().clone(),
      impl->get_storage_offsets().clone());
}

// A tpu argument's host copy: nested ones keep their layout (nested_to_copy),
// plain ones go through the PrivateUse1 kernel (its exact-layout copy).
at::Tensor to_host(const at::Tensor& t) {
  if (!t.defined() || t.is_cpu()) return t;
  if (t.is_nested()) return nested_to_copy(t, std::nullopt, std::nullopt, c10::Device(c10::kCPU), std::nullopt, false,
                                           std::nullopt);
  return at::_to_cpu({t})[0];
}

// The CPU fallback's host copies (a list with a nested tpu tensor dispatches here).
std::vector<at::Tensor> nested_to_cpu(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(to_host(t));
  return out;
}

// Views and metadata queries (sizes, strides, offsets: host tensors) touch
// no values: PyTorch's NestedTensorCPU kernel serves a tpu nested tensor as it
// is, and a view stays a view of the tpu storage.
bool layout_only(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  if (name.rfind("aten::_nested_tensor_", 0) == 0 || name.rfind("aten::_nested_get_", 0) == 0) return true;
  for (const auto& r : schema.returns())
    if (r.alias_info() && !r.alias_info()->isWrite()) return true;
  return false;
}

// The CPU fallback for ops given a nested tpu tensor. PyTorch's cpu_fallback
// redispatches to the CPU key alone, which skips the NestedTensorCPU kernels:
// here arguments are copied and the op dispatched in full. Written arguments
// get their host copy's values back (nested ones storage to storage: the
// copies keep their layout).
void nested_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (layout_only(op.schema()) && op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU)) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
    return;
  }
  eager::FlushReason reason("cpu_fallback");
  const auto& sargs = op.schema().arguments();
  size_t n = sargs.size(), base = stack->size() - n;
  eager::enter_cpu_fallback(op, torch::jit::last(*stack, n));
  std::optional<c10::Device> device;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (tpu argument, its host copy)
  for (size_t i = 0; i < n; ++i) {
    bool writes = sargs[i].alias_info() && sargs[i].alias_info()->isWrite();
    (*stack)[base + i] = eager::map_tensors((*stack)[base + i], [&](const at::Tensor& t) {
      if (!t.defined() || t.is_cpu()) return t;
      if (!device) device = t.device();
      at::Tensor host = to_host(t);
      if (writes) written.emplace_back(t, host);
      return host;
    });
  }
  op.callBoxed(stack);
  for (auto& [arg, host] : written) {
    if (arg.is_nested())
      at::native::get_nested_tensor_impl(arg)->get_unsafe_storage_as_tensor().copy_(
          at::native::get_nested_tensor_impl(host)->get_unsafe_storage_as_tensor());
    else
      arg.copy_(host);
  }
  if (!device) return;
  for (size_t r = stack->size() - op.schema().returns().size(); r < stack->size(); ++r)
    (*stack)[r] = eager::map_tensors((*stack)[r], [&](const at::Tensor& t) {
      for (auto& [arg, host] : written)
        if (host.is_same(t)) return arg;
      return t.defined() && t.is_cpu() ? t.to(*device) : t;
    });
}

// A dense tpu tensor and its nested sizes (a host tensor, as for CUDA) to a
// nested tpu tensor: to_padded_tensor's backward. The generic fallback took
// the host sizes for a device mismatch.
at::Tensor nested_from_padded(const at::Tensor& padded, const at::Tensor& sizes, bool fuse_transform_0213) {
  return at::_nested_from_padded(to_host(padded), sizes, fuse_transform_0213).to(padded.device());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_nested_from_padded", nested_from_padded); }

void route_nested_ops_to_cpu() {
  // Every op with a NestedTensorCPU kernel gets the nested fallback as its
  // NestedTensorPrivateUse1 kernel: a backend fallback alone comes after an
  // op's CompositeImplicitAutograd kernel, which calls sizes() on a nested
  // tensor (matmul, linear).
  static bool done = false;
  if (done) return;
  done = true;
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1,
                                            __FILE__, __LINE__);
  for (const c10::OperatorName& op_name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op_name.name.rfind("aten::", 0) != 0) continue;
    auto handle = c10::Dispatcher::singleton().findOp(op_name);
    if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
        handle->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1))
      continue;
    std::string full = op_name.name.substr(6) + (op_name.overload_name.empty() ? "" : "." + op_name.overload_name);
    library->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_on_cpu>());
  }
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", nested_to_copy);
  m.impl("_to_cpu", nested_to_cpu);
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_on_cpu>());
}

}  // namespace torch_pjrt::device
