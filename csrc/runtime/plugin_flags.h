// The XLA flags torch_pjrt adds to XLA_FLAGS before a plugin is loaded, and
// the per-program compile option it gives small programs.
#pragma once

#include <string>

namespace torch_pjrt::runtime {

// Adds torch_pjrt's flags for the plugin at `path` to XLA_FLAGS, each unless
// XLA_FLAGS already names it, and only if the plugin defines it (XLA aborts
// the process on a flag it does not know).
void add_plugin_flags(const std::string& path);

// Takes out of XLA_FLAGS the flags add_plugin_flags added that the plugin at
// `path` does not define: for a second plugin loaded into the process (libtpu
// compiling for a topology), which reads XLA_FLAGS too.
void drop_flags_unknown_to(const std::string& path);

// Compile options for small programs on XLA's CPU plugin: `base` with
// xla_cpu_use_fusion_emitters=false as a per-compile option override; empty
// where that does not apply (another plugin, one that does not define the
// option, or XLA_FLAGS setting it: the user's setting wins).
std::string small_program_options(const std::string& path, const std::string& name, const std::string& base);

// Programs of at most this many operations take small_program_options.
constexpr int kSmallProgramOps = 64;
// Whether a program takes small_program_options: at most kSmallProgramOps
// operations, none of those the LLVM IR emitters compute worse.
bool suits_small_program_options(const std::string& mlir_text);
// The operations of a program in torch_pjrt's StableHLO text (its generic
// form: one `= "dialect.op"` per operation with results), counted up to `stop`.
int count_ops(const std::string& mlir_text, int stop);

// Whether the shared library at `path` defines the XLA flag `flag`: its name
// as a whole string in the library's read-only data, where XLA's flag table
// keeps the names.
bool plugin_defines_flag(const std::string& path, const std::string& flag);

}  // namespace torch_pjrt::runtime
