// CPU ops that torch_pjrt runs itself (CPU fallbacks, the CPU runs that
// check an op's errors) on a thread other than the one that imported it run
// on that thread alone.
//
// Why: with OpenMP (libgomp, PyTorch's CPU build), the first parallel region
// on a new thread (autograd's tpu device thread, a user's thread) starts a
// second thread team; libgomp then has more threads than CPUs and, from then
// on, stops spinning and sleeps between regions in every team. PyTorch's own
// CPU ops on the main thread became 2.6x slower for the rest of the process
// after a few tpu training steps (an MLP step 0.55 -> 1.44 ms, 2 cores) only
// because a backward's CPU error check ran an mm on autograd's thread.
#pragma once

namespace torch_pjrt::eager {

// The importing thread: CPU ops there keep PyTorch's thread count.
void note_home_thread();

// While alive on another thread: OpenMP uses one thread here.
class SerialCpuOffHome {
 public:
  SerialCpuOffHome();
  ~SerialCpuOffHome();
  SerialCpuOffHome(const SerialCpuOffHome&) = delete;
  SerialCpuOffHome& operator=(const SerialCpuOffHome&) = delete;

 private:
  bool active_ = false;
  int omp_before_ = 0;
};

}  // namespace torch_pjrt::eager
