// An op argument with each of its tensors rewritten (to meta, to a CPU copy):
// one place for the argument kinds that hold tensors.
#pragma once

#include <ATen/core/ivalue.h>

#include <optional>

namespace torch_pjrt::eager {

// `v` with `fn` applied to each tensor of a Tensor, Tensor[] or Tensor?[]
// argument (undefined tensors too; None entries kept); anything else as is.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList()) {
    auto ref = v.toListRef();
    if (!ref.empty() && (ref[0].isTensor() || ref[0].isNone())) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& e : ref)
        out.push_back(e.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(fn(e.toTensor())));
      return out;
    }
  }
  return v;
}

// Calls `fn` on each tensor of a Tensor, Tensor[] or Tensor?[] argument in `args`.
template <typename Fn>
void for_each_tensor(c10::ArrayRef<c10::IValue> args, Fn&& fn) {
  for (const auto& v : args) {
    if (v.isTensor()) {
      fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) fn(t);
    } else if (v.isList()) {
      for (const auto& e : v.toListRef())
        if (e.isTensor()) fn(e.toTensor());
    }
  }
}

}  // namespace torch_pjrt::eager
