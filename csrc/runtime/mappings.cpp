#include "runtime/mappings.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace torch_pjrt::runtime {

int64_t process_mappings() {
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1 << 16];
  int64_t lines = 0;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) lines += std::count(buf, buf + n, '\n');
  ::close(fd);
  return n < 0 ? -1 : lines;
}

int64_t mapping_limit() {
  static const int64_t limit = [] {
    long long v = 65530;
    if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
      if (std::fscanf(f, "%lld", &v) != 1 || v <= 0) v = 65530;
      std::fclose(f);
    }
    return static_cast<int64_t>(v);
  }();
  return limit;
}

}  // namespace torch_pjrt::runtime
