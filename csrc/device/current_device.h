// The thread's current tpu device index (what torch.tpu.set_device sets).
#pragma once

namespace torch_pjrt::device {
int current_device();
void set_current_device(int index);  // checks the index against the plugin
int device_count();                  // 0 when the runtime is not initialized
}  // namespace torch_pjrt::device
