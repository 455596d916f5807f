// Settings read once from the environment.
#pragma once

#include <initializer_list>
#include <string>

namespace torch_pjrt::eager {

// The value of env `name` (`dflt` when unset or empty); raises naming the
// variable when it is not one of `allowed`.
std::string env_choice(const char* name, const char* dflt, std::initializer_list<const char*> allowed);

}  // namespace torch_pjrt::eager
