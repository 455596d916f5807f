#pragma once

#include <c10/core/Allocator.h>

namespace torch_pjrt::device {

// Host memory for tensor.pin_memory() / .to("cpu", non_blocking=True). PJRT
// plugins copy from and to any host memory, so this is ordinary host memory;
// it only remembers which blocks it handed out, for Tensor.is_pinned().
c10::Allocator* pinned_memory_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace torch_pjrt::device
