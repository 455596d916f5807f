#include "runtime/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace torch_pjrt::runtime {

std::optional<int64_t> parse_byte_size(const std::string& text) {
  const char* s = text.c_str();
  while (std::isspace(static_cast<unsigned char>(*s))) ++s;
  char* end = nullptr;
  double number = std::strtod(s, &end);
  if (end == s || !std::isfinite(number) || number < 0) return std::nullopt;
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += static_cast<char>(std::tolower(*p));
  double scale = 1;
  if (!unit.empty() && unit != "b") {
    static const char kPrefixes[] = "kmgt";
    const char* at = std::strchr(kPrefixes, unit[0]);
    std::string rest = unit.substr(1);
    if (!at || !(rest.empty() || rest == "ib" || rest == "b")) return std::nullopt;
    double base = rest == "b" ? 1000.0 : 1024.0;
    scale = std::pow(base, static_cast<double>(at - kPrefixes + 1));
  }
  double bytes = number * scale;
  if (bytes > 9.2e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
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
