// Per-device random generators. Each random op draws a fresh 128-bit key from
// the generator and passes it to the program as an input, so results depend
// on torch.manual_seed / torch.tpu.manual_seed and nothing is compiled per call.
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <optional>

namespace torch_pjrt::device {
const at::Generator& default_generator(int device);
// Two 64-bit words for the program's random state, advancing the generator.
std::pair<uint64_t, uint64_t> next_rng_key(const std::optional<at::Generator>& gen, int device);
}  // namespace torch_pjrt::device
