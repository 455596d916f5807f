#include "runtime/byte_size.h"

#include <cctype>
#include <cstdio>
#include <utility>

namespace torch_pjrt::runtime {

std::optional<int64_t> parse_byte_size(const std::string& text, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<int64_t> {
    if (error) *error = why;
    return std::nullopt;
  };
  std::string s;
  for (char c : text) s += char(std::tolower(static_cast<unsigned char>(c)));
  size_t begin = s.find_first_not_of(" \t"), end = s.find_last_not_of(" \t");
  s = begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
  if (s == "none" || s == "unlimited") return 0;
  // Exact integer arithmetic (no floating point), so cache.py agrees to the byte.
  unsigned __int128 whole = 0, fraction = 0, scale = 1;
  size_t i = 0, digits = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
    whole = whole * 10 + (s[i] - '0');
    if (whole > (unsigned __int128)INT64_MAX) return fail("too large");
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
      if (scale >= (unsigned __int128)1000000000000000000ull) continue;  // 18 digits: plenty
      fraction = fraction * 10 + (s[i] - '0');
      scale *= 10;
    }
  }
  if (digits == 0) return fail("expected a number");
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  std::string unit = s.substr(i);
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},           {"b", 1},
      {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
      {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
      {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
      {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull}};
  for (const auto& [name, multiplier] : kUnits) {
    if (unit != name) continue;
    unsigned __int128 bytes = whole * multiplier + fraction * multiplier / scale;
    if (bytes > (unsigned __int128)INT64_MAX) return fail("too large");
    return int64_t(bytes);
  }
  return fail("unknown unit '" + unit + "'");
}

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace torch_pjrt::runtime
