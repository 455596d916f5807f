// Waiting for a runtime::DeviceEvent from code Python may have called.
#pragma once

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {

// Waits without holding the GIL, so Python threads go on meanwhile.
void wait_released(const runtime::DeviceEvent& e);

}  // namespace torch_pjrt::device
