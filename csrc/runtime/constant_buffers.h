// Small immutable device buffers by content: the runtime scalars and storage
// offsets an op program takes as inputs. An eager op would otherwise make a
// host-to-device buffer for them on every call (and wait for its transfer);
// most calls repeat the same few values (alpha = 1, a learning rate, offset 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::runtime {

// Buffers up to this many bytes are kept; larger ones are made each call.
constexpr size_t kConstantBufferMaxBytes = 64;

// A buffer of shape `dims` and element `type` holding `data`, shared by every
// caller asking for the same bytes on the same device. Callers must never
// donate or overwrite it. Not counted in the device's memory figures (at most
// a few hundred entries of <= 64 bytes; the table is cleared when full).
// A larger one is made for this call and counted as the caller's memory,
// unless `internal` (the caller keeps it in a cache of its own, as a fused
// program keeps the packs it last uploaded).
BufferPtr constant_buffer(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims, int device,
                          bool internal = false);

// Entries kept now (tests).
size_t constant_buffer_count();

}  // namespace torch_pjrt::runtime
