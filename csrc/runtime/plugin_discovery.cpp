// Finds PJRT plugin shared objects installed by pip.
#include <sys/stat.h>

#include <stdexcept>

#include "pjrt_runtime.h"

namespace torch_pjrt::runtime {
namespace {

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const char* kPreference[] = {"tpu", "cuda", "cpu"};

}  // namespace

std::vector<std::string> known_plugin_files(const std::string& name) {
  if (name == "cpu") return {"xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"};
  if (name == "cuda")
    return {"jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so"};
  if (name == "tpu") return {"libtpu/libtpu.so"};
  return {};
}

std::vector<std::pair<std::string, std::string>> discover_plugins(
    const std::vector<std::string>& roots) {
  std::vector<std::pair<std::string, std::string>> found;
  for (const char* name : kPreference) {
    bool done = false;
    for (const auto& rel : known_plugin_files(name)) {
      for (const auto& root : roots) {
        std::string path = root + "/" + rel;
        if (file_exists(path)) {
          found.emplace_back(name, path);
          done = true;
          break;
        }
      }
      if (done) break;
    }
  }
  return found;
}

std::string resolve_plugin(const std::string& name_or_path,
                           const std::vector<std::string>& roots) {
  if (name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 3 && name_or_path.substr(name_or_path.size() - 3) == ".so")) {
    if (!file_exists(name_or_path))
      throw std::runtime_error("torch_pjrt: PJRT plugin file not found: '" + name_or_path +
                               "' (TORCH_PJRT_PLUGIN takes cpu, cuda, tpu or a path to a .so)");
    return name_or_path;
  }
  if (known_plugin_files(name_or_path).empty())
    throw std::runtime_error("torch_pjrt: unknown PJRT plugin name '" + name_or_path +
                             "'; expected one of cpu, cuda, tpu, or a path to a plugin .so");
  for (const auto& [name, path] : discover_plugins(roots))
    if (name == name_or_path) return path;
  std::string wanted;
  for (const auto& rel : known_plugin_files(name_or_path)) wanted += " " + rel;
  throw std::runtime_error("torch_pjrt: PJRT plugin '" + name_or_path +
                           "' is not installed (looked for" + wanted +
                           " under the Python search path)");
}

}  // namespace torch_pjrt::runtime
