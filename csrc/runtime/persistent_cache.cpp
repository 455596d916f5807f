// Persistent executable cache: entry files, atomic writes, validation.
#include "persistent_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <tuple>
#include <vector>

#include "pjrt_runtime.h"
#include "runtime/byte_size.h"

namespace torch_pjrt::runtime {
namespace {

// Bad entries reported one by one; after that, only counted.
constexpr int kMaxBadEntryReports = 10;

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += char((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += char((v >> (8 * i)) & 0xff);
}
uint64_t get_le(const std::string& s, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(s[offset + i])) << (8 * i);
  return v;
}

// Hashes a field with its length first, so field boundaries are unambiguous.
void hash_field(Sha256& h, const std::string& field) {
  std::string len;
  put_u64(len, field.size());
  h.update(len);
  h.update(field);
}

std::string errno_text() { return std::strerror(errno); }

// mkdir -p; false with errno set on failure.
bool make_dirs(const std::string& dir) {
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    prefix = dir.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// Reads the whole regular file. Nothing when it cannot: `error` is empty when
// it does not exist (a miss), else says why.
std::optional<std::string> read_file(const std::string& path, std::string* error) {
  error->clear();
  // O_NONBLOCK: a FIFO named like an entry must not block the open.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT && errno != ENOTDIR) *error = "cannot read: " + errno_text();
    return std::nullopt;
  }
  struct stat st;
  bool stat_ok = ::fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    *error = stat_ok ? std::string("not a regular file (") + file_kind(st.st_mode) + ")"
                     : "cannot read: " + errno_text();
    ::close(fd);
    return std::nullopt;
  }
  std::string data;
  if (st.st_size > 0) data.reserve(st.st_size);
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = "cannot read: " + errno_text();
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    data.append(buf, n);
  }
  ::close(fd);
  return data;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What counts toward the cap, as in cache.py: `*.pjrtexe` (not hidden).
bool is_entry_name(const std::string& name) {
  return name[0] != '.' && ends_with(name, PersistentCache::kSuffix);
}

// A temporary file of store() (".<hex>.tmp.<pid>.<random>").
bool is_temp_name(const std::string& name) {
  return name[0] == '.' && name.find(".tmp.") != std::string::npos;
}

bool write_all(int fd, const std::string& data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    p += n;
    left -= n;
  }
  return true;
}

std::string short_hex(const std::string& bytes) {
  Sha256::Digest d{};
  std::memcpy(d.data(), bytes.data(), std::min(bytes.size(), d.size()));
  return Sha256::hex(d).substr(0, 16);
}

// What sets two identities apart: the first line that differs, both ways.
std::string identity_difference(const std::string& stored, const std::string& current) {
  auto lines = [](const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < s.size()) {
      size_t end = s.find('\n', at);
      if (end == std::string::npos) end = s.size();
      out.push_back(s.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  auto a = lines(stored), b = lines(current);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    std::string x = i < a.size() ? a[i] : "(nothing)";
    std::string y = i < b.size() ? b[i] : "(nothing)";
    if (x != y) return "written with " + x + ", this process has " + y;
  }
  return "written by another plugin";
}

}  // namespace

std::string PersistentCache::configured_dir() {
  if (const char* env = std::getenv("TORCH_PJRT_CACHE_DIR")) return env;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/torch_pjrt/executables";
  const char* home = std::getenv("HOME");
  if (!home || !home[0]) {
    struct passwd* pw = ::getpwuid(::getuid());
    home = pw ? pw->pw_dir : nullptr;
  }
  if (!home || !home[0]) return "";
  return std::string(home) + "/.cache/torch_pjrt/executables";
}

uint64_t PersistentCache::configured_max_size(std::string* warning) {
  const char* env = std::getenv("TORCH_PJRT_CACHE_MAX_SIZE");
  if (!env || !env[0]) return kDefaultMaxSize;
  std::string why;
  if (auto bytes = parse_byte_size(env, &why)) return static_cast<uint64_t>(*bytes);
  if (warning)
    *warning = std::string("torch_pjrt: TORCH_PJRT_CACHE_MAX_SIZE='") + env +
               "' is not a size (" + why +
               "; bytes or a number with a unit: 500M, 2G, 1.5GiB, 10GB; 0, none or "
               "unlimited: no cap); using the default cap of " +
               std::to_string(kDefaultMaxSize >> 30) + " GiB";
  return kDefaultMaxSize;
}

PersistentCache::PersistentCache(std::string dir, std::string identity)
    : dir_(std::move(dir)), identity_(std::move(identity)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (dir_.empty()) enabled_ = false;
  std::string warning;
  max_size_ = configured_max_size(&warning);
  if (enabled() && !warning.empty()) warn_once("max_size", warning);
}

Sha256::Digest PersistentCache::key(const std::string& program,
                                    const std::string& compile_options) const {
  Sha256 h;
  hash_field(h, "torch_pjrt persistent executable cache");
  std::string version;
  put_u32(version, kFormatVersion);
  hash_field(h, version);
  hash_field(h, identity_);
  hash_field(h, compile_options);
  hash_field(h, program);
  return h.finish();
}

std::string PersistentCache::path(const Sha256::Digest& key) const {
  return dir_ + "/" + Sha256::hex(key) + kSuffix;
}

void PersistentCache::warn_once(const std::string& topic, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!warned_.insert(topic).second) return;
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
}

void PersistentCache::disable(const std::string& why) {
  enabled_ = false;
  warn_once("disabled", "torch_pjrt: persistent executable cache " + dir_ +
                            " turned off for this process: " + why);
}

void PersistentCache::report_bad_entry(const std::string& path, const std::string& what) {
  metrics().persistent_cache_errors++;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!warned_.insert("entry:" + path).second) return;
    int n = ++bad_entries_reported_;
    if (n > kMaxBadEntryReports + 1) return;
    message = n <= kMaxBadEntryReports
                  ? "torch_pjrt: ignoring cache entry " + path + ": " + what +
                        "; recompiling"
                  : "torch_pjrt: more bad entries in the persistent cache " + dir_ +
                        " are ignored silently (metrics()['persistent_cache_errors'])";
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
}

std::optional<std::string> PersistentCache::load(const Sha256::Digest& key,
                                                 size_t program_size) {
  if (!enabled()) return std::nullopt;
  std::string file = path(key);
  std::string error;
  auto data = read_file(file, &error);
  if (!data) {
    if (!error.empty()) report_bad_entry(file, error);
    return std::nullopt;
  }
  const std::string& d = *data;
  auto bad = [&](const std::string& what) {
    report_bad_entry(file, what);
    return std::nullopt;
  };
  if (d.compare(0, 8, kMagic, 0, std::min<size_t>(d.size(), 8)) != 0)
    return bad("not a torch_pjrt cache entry (bad magic)");
  if (d.size() < kHeaderSize)
    return bad("truncated (" + std::to_string(d.size()) + " of at least " +
               std::to_string(kHeaderSize) + " bytes)");
  uint32_t version = get_le(d, 8, 4);
  if (version != kFormatVersion)
    return bad("format version " + std::to_string(version) + ", this build reads " +
               std::to_string(kFormatVersion));
  uint64_t identity_size = get_le(d, 12, 4);
  uint64_t payload_size = get_le(d, 56, 8);
  uint64_t expected = kHeaderSize + identity_size + payload_size;
  if (payload_size > (uint64_t(1) << 40))
    return bad("corrupted header (payload length " + std::to_string(payload_size) + ")");
  if (d.size() < expected)
    return bad("truncated (" + std::to_string(d.size()) + " of " + std::to_string(expected) +
               " bytes)");
  if (d.size() > expected)
    return bad("size mismatch (" + std::to_string(d.size()) + " bytes, header says " +
               std::to_string(expected) + ")");
  if (std::memcmp(d.data() + 16, key.data(), key.size()) != 0)
    return bad("foreign entry (stored key " + short_hex(d.substr(16, 32)) +
               "... does not match the file name)");
  std::string stored_identity = d.substr(kHeaderSize, identity_size);
  if (stored_identity != identity_)
    return bad("foreign entry (" + identity_difference(stored_identity, identity_) + ")");
  if (get_le(d, 48, 8) != program_size)
    return bad("foreign entry (stored program length " + std::to_string(get_le(d, 48, 8)) +
               ", expected " + std::to_string(program_size) + ")");
  auto checksum = Sha256::of(d.data() + kHeaderSize + identity_size, payload_size);
  if (std::memcmp(d.data() + 64, checksum.data(), checksum.size()) != 0)
    return bad("corrupted payload (checksum mismatch)");
  // Its last use, for the size cap. A cache shared read-only cannot be
  // touched; recency is then only a hint, so failures are ignored.
  ::utimensat(AT_FDCWD, file.c_str(), nullptr, 0);
  return d.substr(kHeaderSize + identity_size);
}

bool PersistentCache::store(const Sha256::Digest& key, size_t program_size,
                            const std::string& payload) {
  if (!enabled() || !writable_.load()) return false;
  if (!dir_ready_.load()) {
    if (!make_dirs(dir_)) {
      writable_ = false;
      warn_once("write", "torch_pjrt: cannot create the persistent executable cache " + dir_ +
                             ": " + errno_text() + "; compiled programs are not saved");
      return false;
    }
    dir_ready_ = true;
  }
  std::string entry;
  entry.reserve(kHeaderSize + identity_.size() + payload.size());
  entry.append(kMagic, 8);
  put_u32(entry, kFormatVersion);
  put_u32(entry, identity_.size());
  entry.append(reinterpret_cast<const char*>(key.data()), key.size());
  put_u64(entry, program_size);
  put_u64(entry, payload.size());
  auto checksum = Sha256::of(payload);
  entry.append(reinterpret_cast<const char*>(checksum.data()), checksum.size());
  entry += identity_;
  entry += payload;

  // A unique temporary name in the same directory, then rename(): readers and
  // concurrent writers of the same entry only ever see complete files.
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}() ^ (uint64_t(::getpid()) << 32)};
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%016llx", int(::getpid()),
                (unsigned long long)(rng() + counter++));
  std::string final_path = path(key);
  std::string tmp = dir_ + "/." + Sha256::hex(key) + suffix;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT && make_dirs(dir_))  // removed while we run
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, entry);
  std::string error = ok ? "" : errno_text();
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    ok = false;
    error = errno_text();
  }
  if (ok && ::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    // Only this entry's name is taken (a directory, a file of another user in
    // a sticky directory): the other programs can still be saved.
    if (saved == EISDIR || saved == ENOTEMPTY || saved == EEXIST || saved == EPERM) {
      warn_once("entry-write:" + final_path, "torch_pjrt: cannot save cache entry " +
                                                 final_path + ": " + std::strerror(saved) +
                                                 "; this program is not saved");
      return false;
    }
    ok = false;
    error = std::strerror(saved);
  }
  if (!ok) {
    if (fd >= 0) ::unlink(tmp.c_str());
    writable_ = false;
    warn_once("write", "torch_pjrt: cannot write to the persistent executable cache " + dir_ +
                           ": " + error + "; compiled programs are not saved");
    return false;
  }
  metrics().persistent_cache_writes++;
  if (max_size_) after_write(Sha256::hex(key) + kSuffix, entry.size());
  return true;
}

void PersistentCache::after_write(const std::string& name, uint64_t bytes) {
  constexpr auto kRescanSeconds = std::chrono::seconds(60);
  std::lock_guard<std::mutex> lock(cap_mutex_);
  auto now = std::chrono::steady_clock::now();
  cap_estimate_ += bytes;
  if (cap_scanned_ && cap_estimate_ <= max_size_ && now - cap_scan_time_ < kRescanSeconds) return;
  metrics().persistent_cache_scans++;
  cap_estimate_ = enforce_cap(name);
  cap_scanned_ = true;
  cap_scan_time_ = now;
}

uint64_t PersistentCache::enforce_cap(const std::string& keep) {
  DIR* dir = ::opendir(dir_.c_str());
  if (!dir) {
    warn_once("scan", "torch_pjrt: cannot list the persistent executable cache " + dir_ + ": " +
                          errno_text() + "; its size cap is not enforced");
    return 0;
  }
  struct File {
    struct timespec mtime;
    std::string name;
    uint64_t size;
  };
  std::vector<File> files;
  uint64_t total = 0;
  time_t stale_before = std::time(nullptr) - kStaleTempSeconds;
  int fd = ::dirfd(dir);
  while (struct dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    bool entry = is_entry_name(name), temp = !entry && is_temp_name(name);
    struct stat st;
    // Not following symlinks: a link takes no room here, and deleting its
    // target would reach outside the cache. Gone meanwhile: skipped.
    if ((!entry && !temp) || ::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    if (temp) {
      if (st.st_mtime < stale_before) ::unlinkat(fd, name.c_str(), 0);
      continue;
    }
    total += st.st_size;
    files.push_back({st.st_mtim, std::move(name), uint64_t(st.st_size)});
  }
  if (total > max_size_) {
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) {
      return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.name) <
             std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.name);
    });
    for (const File& f : files) {
      if (total <= max_size_) break;
      if (f.name == keep) continue;
      if (::unlinkat(fd, f.name.c_str(), 0) == 0) {
        evictions_++;
      } else if (errno != ENOENT) {  // ENOENT: another process evicted it first
        warn_once("evict", "torch_pjrt: cannot evict " + dir_ + "/" + f.name +
                               " from the persistent executable cache: " + errno_text() +
                               "; it may grow past TORCH_PJRT_CACHE_MAX_SIZE");
        continue;
      }
      total -= f.size;
    }
  }
  ::closedir(dir);
  return total;
}

}  // namespace torch_pjrt::runtime
