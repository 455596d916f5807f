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
// While set (on this thread), next_rng_key returns `key` and draws nothing:
// a random op run again under activation checkpointing's saved state
// (run_with_rng_state) draws what it drew the first time.
void force_rng_key(std::optional<std::pair<uint64_t, uint64_t>> key);
const std::optional<std::pair<uint64_t, uint64_t>>& forced_rng_key();
}  // namespace torch_pjrt::device
