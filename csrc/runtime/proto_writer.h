// The smallest protobuf writer the compile options need (xla.CompileOptionsProto
// and what it holds): varints and length-delimited fields.
#pragma once

#include <cstdint>
#include <string>

namespace torch_pjrt::runtime::proto {

inline void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void field_varint(std::string& out, int field, uint64_t v) {
  varint(out, static_cast<uint64_t>(field) << 3);
  varint(out, v);
}
inline void field_bytes(std::string& out, int field, const std::string& bytes) {
  varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  varint(out, bytes.size());
  out += bytes;
}

}  // namespace torch_pjrt::runtime::proto
