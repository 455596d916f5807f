// Counter-based random bits for lowerings: Threefry-2x32 (20 rounds, Salmon et
// al. 2011) keyed by the i64[2] state the executor draws from the tpu
// generator for each call. Written with signless i32 ops: stablehlo's
// rng_bit_generator needs unsigned types the lowering DType set cannot express.
#pragma once

#include "lowering/builder.h"

namespace torch_pjrt::lowering::ops {

// `n` random 32-bit words (i32, flat): Threefry of the counters 0..m-1 keyed by
// the first 64 bits of `key`, the other 64 bits offsetting the counters.
Value random_words(Builder& b, const Value& key, int64_t n);
// `n` float32 values uniform in [0, 1) with 24 random bits each (flat).
Value uniform01(Builder& b, const Value& key, int64_t n);

}  // namespace torch_pjrt::lowering::ops
