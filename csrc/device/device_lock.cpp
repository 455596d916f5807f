#include "device/device_lock.h"

#include <Python.h>

#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::device {
namespace {
std::recursive_mutex& mutex() {
  static auto* m = new std::recursive_mutex();  // never destroyed: ops may run during exit
  return *m;
}
}  // namespace

DeviceLock::DeviceLock() {
  runtime::Runtime::get();  // raises in a forked child
  if (mutex().try_lock()) return;
  if (Py_IsInitialized() && PyGILState_Check()) {
    // Let the holder take the GIL if it needs it, while we wait.
    PyThreadState* state = PyEval_SaveThread();
    mutex().lock();
    PyEval_RestoreThread(state);
  } else {
    mutex().lock();
  }
}

DeviceLock::~DeviceLock() { mutex().unlock(); }

}  // namespace torch_pjrt::device
