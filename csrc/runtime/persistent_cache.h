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
//
// Size cap (TORCH_PJRT_CACHE_MAX_SIZE, default 10 GiB): an entry's mtime is
// its last use (set when written, touched on every hit). After each write, if
// the regular files named `*.pjrtexe` add up to more than the cap, the least
// recently used ones are deleted until the total fits, never the one just
// written. Other processes may delete the same files meanwhile; that is fine.
// Adding up the files costs a stat each (0.2 s for a 100,000-entry, 1.9 GB
// directory here, paid by every compile when it ran after each write), so the
// directory is scanned at a process's first write, then again only when the
// last scan's total plus what this process wrote since passes the cap, or
// kRescanSeconds after the last scan (what other processes wrote meanwhile).
// Temporary files of interrupted writes older than kStaleTempSeconds go too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
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
  static constexpr uint64_t kDefaultMaxSize = uint64_t(10) << 30;
  // A temporary file this old belongs to a write that died (writes take
  // milliseconds); cache.py uses the same age.
  static constexpr int64_t kStaleTempSeconds = 3600;

  // The directory from TORCH_PJRT_CACHE_DIR ("" when set empty: disabled),
  // else $XDG_CACHE_HOME/torch_pjrt/executables, else
  // ~/.cache/torch_pjrt/executables.
  static std::string configured_dir();
  // The cap from TORCH_PJRT_CACHE_MAX_SIZE (unset or empty: kDefaultMaxSize;
  // 0: none); a bad value gives the default and a message in `warning`.
  static uint64_t configured_max_size(std::string* warning);

  // `identity` names the plugin build and the machine it compiles for; it is
  // part of every key and stored in every entry. The cap is
  // configured_max_size() (a bad setting warns once here).
  PersistentCache(std::string dir, std::string identity);

  bool enabled() const { return enabled_.load(); }
  const std::string& dir() const { return dir_; }
  const std::string& identity() const { return identity_; }
  // The size cap in bytes; 0: none.
  uint64_t max_size() const { return max_size_; }
  // Entries this process deleted to keep the directory under the cap.
  int64_t evictions() const { return evictions_.load(); }

  Sha256::Digest key(const std::string& program, const std::string& compile_options) const;
  std::string path(const Sha256::Digest& key) const;

  // The payload of the valid entry for `key`, or nothing: no entry (a miss),
  // or a bad one (reported once, counted in persistent_cache_errors). A valid
  // entry's mtime is set to now: its last use, for the size cap.
  std::optional<std::string> load(const Sha256::Digest& key, size_t program_size);
  // Writes the entry atomically (unique temporary file, then rename), then
  // enforces the size cap. If the directory cannot take files (full, read
  // only), warns once and stops writing for the rest of the process; if only
  // this entry's name is taken (say, by a directory), warns once for it.
  // Returns whether the entry was written.
  bool store(const Sha256::Digest& key, size_t program_size, const std::string& payload);

  // An entry that read back fine but is unusable (e.g. does not deserialize).
  void report_bad_entry(const std::string& path, const std::string& what);
  // Turns the cache off for this process, with one warning.
  void disable(const std::string& why);

 private:
  void warn_once(const std::string& topic, const std::string& message);
  // Deletes least recently used entries until the total is under the cap;
  // `keep` (a file name) is never deleted.
  // Returns the total left.
  uint64_t enforce_cap(const std::string& keep);
  // After `bytes` were written as `name`: enforce_cap when due (see above).
  void after_write(const std::string& name, uint64_t bytes);

  std::string dir_;
  std::string identity_;
  std::atomic<bool> enabled_{true};
  std::atomic<bool> writable_{true};
  std::atomic<bool> dir_ready_{false};
  uint64_t max_size_ = kDefaultMaxSize;
  std::atomic<int64_t> evictions_{0};
  std::mutex mutex_;
  std::mutex cap_mutex_;  // the three below
  bool cap_scanned_ = false;
  uint64_t cap_estimate_ = 0;
  std::chrono::steady_clock::time_point cap_scan_time_;
  std::set<std::string> warned_;
  int bad_entries_reported_ = 0;
};

}  // namespace torch_pjrt::runtime
