// The XLA flags torch_pjrt adds to XLA_FLAGS before a plugin is loaded.
#pragma once

#include <string>

namespace torch_pjrt::runtime {

// Adds torch_pjrt's flags for the plugin at `path` (`name`: "cpu", "cuda",
// "tpu"...) to XLA_FLAGS, each unless XLA_FLAGS already names it, and only if
// the plugin defines it (XLA aborts the process on a flag it does not know).
void add_plugin_flags(const std::string& path, const std::string& name);

// Takes out of XLA_FLAGS the flags add_plugin_flags added that the plugin at
// `path` does not define: for a second plugin loaded into the process (libtpu
// compiling for a topology), which reads XLA_FLAGS too.
void drop_flags_unknown_to(const std::string& path);

// Whether the shared library at `path` defines the XLA flag `flag`: its name
// as a whole string in the library's read-only data, where XLA's flag table
// keeps the names.
bool plugin_defines_flag(const std::string& path, const std::string& flag);

}  // namespace torch_pjrt::runtime
