// Byte sizes in settings ("8GiB", "500M", "1.5G") and in messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace torch_pjrt::runtime {

// SIZE: bytes, or a number with a unit: K/KiB, M/MiB, G/GiB, T/TiB are powers
// of 1024; KB, MB, GB, TB powers of 1000 (case-insensitive, as coreutils).
// "none" and "unlimited" give 0 (no bound). Nothing on bad text, with
// `error` saying why. torch_pjrt/cache.py parse_size() is the same.
std::optional<int64_t> parse_byte_size(const std::string& text, std::string* error = nullptr);
// "1.50 GiB", "512 bytes".
std::string format_bytes(int64_t bytes);

}  // namespace torch_pjrt::runtime
