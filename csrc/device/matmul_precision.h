// torch.get_float32_matmul_precision() as the lowering library's Precision
// (lowering/builder.h): what float32 dots and convolutions ask XLA for.
#pragma once

#include <ATen/Context.h>

#include "lowering/builder.h"

namespace torch_pjrt::device {

inline lowering::Precision f32_matmul_precision() {
  try {
    switch (at::globalContext().float32MatmulPrecision()) {
      case at::Float32MatmulPrecision::HIGH: return lowering::Precision::High;
      case at::Float32MatmulPrecision::MEDIUM: return lowering::Precision::Default;
      default: return lowering::Precision::Highest;
    }
  } catch (const c10::Error&) {
    // (PyTorch refuses to answer after a mix of its legacy and new TF32
    // settings; full float32 is what CPU computes.)
    return lowering::Precision::Highest;
  }
}

}  // namespace torch_pjrt::device
