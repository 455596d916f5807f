#include "eager/env.h"

#include <c10/util/Exception.h>

#include <cstdlib>

namespace torch_pjrt::eager {

std::string env_choice(const char* name, const char* dflt, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  std::string value = v && *v ? v : dflt;
  std::string listed;
  for (const char* a : allowed) {
    if (value == a) return value;
    listed += (listed.empty() ? "'" : " or '") + std::string(a) + "'";
  }
  TORCH_CHECK(false, "torch_pjrt: ", name, " must be ", listed, ", got '", value, "'");
}

}  // namespace torch_pjrt::eager
