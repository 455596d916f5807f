// SHA-256 (FIPS 180-4), for persistent-cache keys and entry checksums.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace torch_pjrt::runtime {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void update(const void* data, size_t size);
  void update(const std::string& s) { update(s.data(), s.size()); }
  // Ends the computation; the object must not be updated afterwards.
  Digest finish();

  static Digest of(const void* data, size_t size);
  static Digest of(const std::string& s) { return of(s.data(), s.size()); }
  static std::string hex(const Digest& d);

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

}  // namespace torch_pjrt::runtime
