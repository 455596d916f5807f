// The persistent executable cache: serialized executables on disk, keyed by
// a SHA-256 of (program text, compile options, plugin identity), so a later
// process running the same programs loads them instead of compiling.
//
// This file only deals with files; serializing and loading executables is the
// runtime's job (pjrt_runtime.cpp). Every failure here is reported on stderr
// and turns into a miss: the cache never breaks compilation.
//
// Entry file `<dir>/<64 hex digits of the key>.pjrtexe`, integers little-endian:
//
//   offset  size  field
//        0     8  magic "TPJRTEXE"
//        8     4  format version (kFormatVersion)
//       12     4  identity length I
//       16    32  key: SHA-256 of the fields below (must match the file name)
//       48     8  program text length in bytes
//       56     8  payload length P
//       64    32  SHA-256 of the payload
//       96     I  plugin identity text ("name=value" lines)
//     96+I     P  payload: PJRT_Executable_Serialize's bytes
//
// torch_pjrt/cache.py reads the same layout (keep both in step).
#pragma once

#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "sha256.h"

namespace torch_pjrt::runtime {

class PersistentCache {
 public:
  static constexpr char kMagic[9] = "TPJRTEXE";
  static constexpr uint32_t kFormatVersion = 1;
  static constexpr size_t kHeaderSize = 96;
  static constexpr const char* kSuffix = ".pjrtexe";

  // The directory from TORCH_PJRT_CACHE_DIR ("" when set empty: disabled),
  // else $XDG_CACHE_HOME/torch_pjrt/executables, else
  // ~/.cache/torch_pjrt/executables.
  static std::string configured_dir();

  // `identity` names the plugin build and the machine it compiles for; it is
  // part of every key and stored in every entry.
  PersistentCache(std::string dir, std::string identity);

  bool enabled() const { return enabled_.load(); }
  const std::string& dir() const { return dir_; }
  const std::string& identity() const { return identity_; }

  Sha256::Digest key(const std::string& program, const std::string& compile_options) const;
  std::string path(const Sha256::Digest& key) const;

  // The payload of the valid entry for `key`, or nothing: no entry (a miss),
  // or a bad one (reported once, counted in persistent_cache_errors).
  std::optional<std::string> load(const Sha256::Digest& key, size_t program_size);
  // Writes the entry atomically (unique temporary file, then rename). On a
  // failure, warns once and stops writing for the rest of the process.
  // Returns whether the entry was written.
  bool store(const Sha256::Digest& key, size_t program_size, const std::string& payload);

  // An entry that read back fine but is unusable (e.g. does not deserialize).
  void report_bad_entry(const std::string& path, const std::string& what);
  // Turns the cache off for this process, with one warning.
  void disable(const std::string& why);

 private:
  void warn_once(const std::string& topic, const std::string& message);

  std::string dir_;
  std::string identity_;
  std::atomic<bool> enabled_{true};
  std::atomic<bool> writable_{true};
  std::atomic<bool> dir_ready_{false};
  std::mutex mutex_;
  std::set<std::string> warned_;
  int bad_entries_reported_ = 0;
};

}  // namespace torch_pjrt::runtime
