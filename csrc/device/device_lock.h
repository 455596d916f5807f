// One lock for everything that reads or replaces tpu storages' buffers.
//
// A storage's buffer is a slot every op reads and in-place ops replace; ops
// from several Python threads (a trainer and a logging, EMA or checkpoint
// thread) must not interleave inside one op. Each op (eager op, copy, host
// read, compiled-graph run) takes this lock for its whole duration, so a race
// between threads picks some serial order of whole ops, as PyTorch promises on
// CPU. It is recursive (an op's CPU fallback copies run nested ops) and never
// waits while holding the GIL (a holder may need the GIL for a Python Meta
// kernel). In a forked child it raises instead of waiting on a lock the
// parent's threads may have held at fork time.
#pragma once

#include <mutex>

namespace torch_pjrt::device {

class DeviceLock {
 public:
  DeviceLock();
  ~DeviceLock();
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;
};

}  // namespace torch_pjrt::device
