// A PJRT plugin loaded for compiling only (libtpu on a machine with no TPU),
// beside the plugin that runs the tensors: it creates a topology description
// from a name ("v5e:2x2") and compiles StableHLO for it without a client,
// returning what XLA knows of the result: compiled memory statistics, the
// cost analysis, the optimized program and the serialized executable.
//
// Start-up never hangs: without a TPU on the PCI bus the environment libtpu
// needs is set first (TPU_SKIP_MDS_QUERY=1: else it queries a cloud metadata
// server for minutes), and PJRT_Plugin_Initialize runs under a deadline.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "xla/pjrt/c/pjrt_c_api.h"

namespace torch_pjrt::runtime {

// A topology creation option (PJRT named value).
struct TopologyOption {
  std::string name;
  enum Kind { Int, IntList, String, Bool } kind = Int;
  int64_t i = 0;
  std::vector<int64_t> list;
  std::string s;
  bool b = false;
};

struct DeviceInfo {
  int id = 0;
  std::string kind;
  std::map<std::string, std::string> attributes;
};

struct TopologyInfo {
  std::string name;
  std::string platform;
  std::string platform_version;
  std::vector<DeviceInfo> devices;
  std::map<std::string, std::string> attributes;  // e.g. device_memory_bytes_limit
};

struct CompiledForTopology {
  std::map<std::string, int64_t> memory;  // PJRT_Executable_GetCompiledMemoryStats, in bytes
  std::map<std::string, double> cost;     // PJRT_Executable_GetCostAnalysis ("flops", ...)
  std::string optimized_program;          // serialized HloModuleProto (format below)
  std::string optimized_format;
  std::string serialized;                 // PJRT_Executable_Serialize: loadable on a real TPU
  double seconds = 0;
};

class CompileOnlyPlugin;

class Topology {
 public:
  ~Topology();
  const TopologyInfo& info() const { return info_; }
  PJRT_TopologyDescription* get() const { return topology_; }

 private:
  friend class CompileOnlyPlugin;
  std::shared_ptr<const CompileOnlyPlugin> plugin_;
  PJRT_TopologyDescription* topology_ = nullptr;
  TopologyInfo info_;
};

class CompileOnlyPlugin : public std::enable_shared_from_this<CompileOnlyPlugin> {
 public:
  // Loads and initializes the plugin at `path`; raises naming what failed,
  // also when initialization takes longer than `timeout_s`.
  static std::shared_ptr<CompileOnlyPlugin> load(const std::string& path, double timeout_s);

  std::shared_ptr<Topology> topology(const std::string& name, const std::vector<TopologyOption>& options) const;
  // Compiles `mlir_text` for `topology`: `partitions` > 1 with SPMD
  // partitioning follows the program's mhlo.sharding annotations.
  CompiledForTopology compile(const Topology& topology, const std::string& mlir_text, int replicas,
                              int partitions, bool spmd) const;

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  std::string api_version() const;
  void check(PJRT_Error* error, const char* what) const;

 private:
  const PJRT_Api* api_ = nullptr;
  std::string path_;
};

// Whether a TPU is on this machine's PCI bus (vendor 0x1ae0, Google).
bool tpu_present();

}  // namespace torch_pjrt::runtime
