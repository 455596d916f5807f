// The device path's answer to a dead or hung peer: an on-device collective
// that has not completed within its group's timeout ends the process, after
// saying so on stderr, as PyTorch's NCCL watchdog does by default
// (TORCH_NCCL_ASYNC_ERROR_HANDLING=3). A collective runs inside the plugin,
// where c10d's timeout cannot reach; without this a lost peer would leave
// every later host read waiting forever.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::distributed {

// One watched collective: begun before its launch (a plugin may run the
// collective inside the launch call and wait there for its peers), given the
// device event recorded after the launch once it returns.
class Watch {
 public:
  Watch(std::chrono::milliseconds timeout, std::string what);
  void launched(runtime::DeviceEventPtr done);

  struct Item;  // (watchdog.cpp)

 private:
  std::shared_ptr<Item> item_;
};

}  // namespace torch_pjrt::distributed
