// Programs loaded ahead from the persistent cache (step capture's warm start).
//
// While "noting", every program compile() asks for is remembered by its
// persistent-cache key and text size; torch_pjrt.capture_step saves that list
// next to the cache once a step is replayable. A new process hands the list
// to prefetch() at the step's first call: a background thread loads those
// entries while the step's Python runs, and compile() takes a loaded program
// instead of loading it again (waiting if that one is being loaded).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/pjrt_runtime.h"
#include "runtime/sha256.h"

namespace torch_pjrt::runtime::prefetch {

using Loader = std::function<ExecutablePtr(const Sha256::Digest&, size_t program_size)>;

void set_noting(bool on);
// The keys noted since noting was last switched on: (hex digest, program size).
std::vector<std::pair<std::string, int64_t>> noted();
// compile()'s side: remember the key while noting.
void note(const Sha256::Digest& key, size_t program_size);

// Starts loading these entries on a background thread (after any earlier
// prefetch finished). Keys already loaded or malformed are skipped.
void start(const std::vector<std::pair<std::string, int64_t>>& keys, Loader load);
// The prefetched program for `key` (waiting while it is being loaded), or null.
ExecutablePtr take(const Sha256::Digest& key);
// Stops the thread after its current load, joins it, forgets unused programs.
void stop();

struct Stats {
  int64_t loaded = 0, taken = 0, unused = 0;
};
Stats stats();

}  // namespace torch_pjrt::runtime::prefetch
