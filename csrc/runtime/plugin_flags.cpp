// The XLA flags torch_pjrt adds before a plugin is loaded, and the check that
// the plugin knows them (an unknown flag in XLA_FLAGS is a fatal error in
// XLA); the compile option small programs take on XLA's CPU plugin.
#include "runtime/plugin_flags.h"

#include "runtime/proto_writer.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace torch_pjrt::runtime {
namespace {

struct Flag {
  const char* name;
  const char* value;
};

// xla_allow_excess_precision=false: XLA may skip a rounding to a narrower
// float type when it fuses; `(a * b).float()` on bf16 tensors would then keep
// the f32 product. PyTorch rounds each op's result to its dtype, and fused
// eager traces and compiled graphs must give what strict eager gives.
const Flag kFlags[] = {
    {"xla_allow_excess_precision", "false"},
};

// XLA:CPU's MLIR fusion emitters set up an MLIR context and pass pipeline per
// fusion; its LLVM IR emitters compile a program of a few ops in about two
// thirds of the time, and a large one in up to three times the time (the
// crossing near 64 ops; docs/results.md, session 51). Eager compiles one
// small program per op and shape: that is the cold start of every eager
// model. What the two emitters compute differently: suits_small_program_options.
constexpr char kEmitterOption[] = "xla_cpu_use_fusion_emitters";

std::mutex g_mutex;
std::vector<std::string> g_added;  // names add_plugin_flags put in XLA_FLAGS

std::string env_flags() {
  const char* v = std::getenv("XLA_FLAGS");
  return v ? v : "";
}

// The byte range of the ELF section `want` in the mapped file, or {0, 0}.
std::pair<size_t, size_t> section(const unsigned char* data, size_t size, const char* want) {
  if (size < sizeof(Elf64_Ehdr) || std::memcmp(data, ELFMAG, SELFMAG) != 0 || data[EI_CLASS] != ELFCLASS64)
    return {0, 0};
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(data);
  if (eh->e_shoff == 0 || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shstrndx >= eh->e_shnum ||
      eh->e_shoff + size_t(eh->e_shnum) * sizeof(Elf64_Shdr) > size)
    return {0, 0};
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(data + eh->e_shoff);
  const Elf64_Shdr& names = sh[eh->e_shstrndx];
  if (names.sh_offset + names.sh_size > size) return {0, 0};
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_name >= names.sh_size) continue;
    const char* n = reinterpret_cast<const char*>(data + names.sh_offset + sh[i].sh_name);
    if (std::strncmp(n, want, names.sh_size - sh[i].sh_name) == 0 && sh[i].sh_type != SHT_NOBITS &&
        sh[i].sh_offset + sh[i].sh_size <= size)
      return {sh[i].sh_offset, sh[i].sh_offset + sh[i].sh_size};
  }
  return {0, 0};
}

bool is_name_char(unsigned char c) { return std::isalnum(c) || c == '_'; }

}  // namespace

bool plugin_defines_flag(const std::string& path, const std::string& flag) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return false;
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return false;
  const auto* data = static_cast<const unsigned char*>(map);
  auto [begin, end] = section(data, size, ".rodata");
  if (begin == end) end = size;  // no section table to go by: the whole file
  // The name, whole: a NUL after it and no name character before it.
  std::string needle = flag + '\0';
  bool found = false;
  for (size_t at = begin; at < end && !found;) {
    const void* hit = ::memmem(data + at, end - at, needle.data(), needle.size());
    if (!hit) break;
    size_t pos = static_cast<const unsigned char*>(hit) - data;
    found = pos == begin || !is_name_char(data[pos - 1]);
    at = pos + 1;
  }
  ::munmap(map, size);
  return found;
}

void add_plugin_flags(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string v = env_flags();
  for (const Flag& f : kFlags) {
    if (v.find(f.name) != std::string::npos) continue;  // the user's setting wins
    if (!plugin_defines_flag(path, f.name)) continue;
    v += (v.empty() ? "--" : " --") + std::string(f.name) + "=" + f.value;
    g_added.push_back(f.name);
  }
  ::setenv("XLA_FLAGS", v.c_str(), 1);
}

std::string small_program_options(const std::string& path, const std::string& name, const std::string& base) {
  if (name != "cpu" || env_flags().find(kEmitterOption) != std::string::npos) return "";
  if (!plugin_defines_flag(path, kEmitterOption)) return "";
  // CompileOptionsProto.env_option_overrides (7): map<string, OptionOverrideProto>,
  // an entry {key (1), value (2): {bool_field (2)}}; applied over XLA_FLAGS.
  std::string value, entry, options = base;
  proto::field_varint(value, 2, 0);
  proto::field_bytes(entry, 1, kEmitterOption);
  proto::field_bytes(entry, 2, value);
  proto::field_bytes(options, 7, entry);
  return options;
}

bool suits_small_program_options(const std::string& mlir_text) {
  if (count_ops(mlir_text, kSmallProgramOps) > kSmallProgramOps) return false;
  // A differential sweep of 3,531 op/dtype/value cases against CPU (session
  // 51) found the LLVM IR emitters closer for erf, digamma, erfinv and
  // logaddexp2, and worse for tan (subnormal inputs give 0; 2 ulp against 1)
  // and lgamma (7 ulp against 3); they also round float8 conversions
  // otherwise than CPU (18 tests/test_float8.py cases). Programs holding
  // those keep the fusion emitters. (bf16 subnormals: the fusion emitters
  // flush every one to 0, the LLVM IR ones order a few wrongly; neither is
  // kept apart for it.)
  auto has = [&](const char* s) { return mlir_text.find(s) != std::string::npos; };
  if (has("\"stablehlo.tan\"") || has("\"chlo.tan\"") || has("\"chlo.lgamma\"") || has("xf8E") || has("<f8E"))
    return false;
  return true;
}

int count_ops(const std::string& mlir_text, int stop) {
  int n = 0;
  for (size_t at = mlir_text.find("= \""); at != std::string::npos && n <= stop; at = mlir_text.find("= \"", at + 3))
    ++n;
  return n;
}

void drop_flags_unknown_to(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::string v = env_flags();
  for (const std::string& name : g_added) {
    if (plugin_defines_flag(path, name)) continue;
    std::string item = "--" + name + "=";
    size_t at = v.find(item);
    if (at == std::string::npos) continue;
    size_t stop = v.find(' ', at);
    v.erase(at, stop == std::string::npos ? std::string::npos : stop - at + 1);
  }
  while (!v.empty() && v.back() == ' ') v.pop_back();
  ::setenv("XLA_FLAGS", v.c_str(), 1);
}

}  // namespace torch_pjrt::runtime
