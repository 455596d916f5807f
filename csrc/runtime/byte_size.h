// Byte sizes in settings ("8GiB", "500M", "1.5e9") and in messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace torch_pjrt::runtime {

// Bytes from a number with an optional unit (case-insensitive): none or "B"
// (bytes), K/M/G/T or KiB/MiB/GiB/TiB (powers of 1024), KB/MB/GB/TB (powers
// of 1000). "1.5G", "500MiB", "8e9". nullopt when `text` is not such a size.
std::optional<int64_t> parse_byte_size(const std::string& text);
// "1.50 GiB", "512 bytes".
std::string format_bytes(int64_t bytes);

}  // namespace torch_pjrt::runtime
