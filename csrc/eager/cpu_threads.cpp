#include "eager/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <thread>

namespace torch_pjrt::eager {
namespace {

// Looked up at run time: PyTorch's CPU build loads libgomp; where it is
// absent there is no second team to avoid either. (MKL's GEMM, linked into
// libtorch_cpu, follows the thread's OpenMP setting: no team is started on
// such a thread, checked under gdb on GOMP_parallel.)
struct ThreadApi {
  void (*omp_set)(int) = nullptr;
  int (*omp_get)() = nullptr;
};

const ThreadApi& api() {
  static const ThreadApi a = [] {
    ThreadApi r;
    void* gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void* from = gomp ? gomp : RTLD_DEFAULT;
    r.omp_set = reinterpret_cast<void (*)(int)>(dlsym(from, "omp_set_num_threads"));
    r.omp_get = reinterpret_cast<int (*)()>(dlsym(from, "omp_get_max_threads"));
    return r;
  }();
  return a;
}

std::thread::id g_home;
bool g_home_set = false;

}  // namespace

void note_home_thread() {
  g_home = std::this_thread::get_id();
  g_home_set = true;
}

SerialCpuOffHome::SerialCpuOffHome() {
  if (!g_home_set || std::this_thread::get_id() == g_home) return;
  const ThreadApi& a = api();
  // PyTorch sets a thread's OpenMP count lazily at its first parallel_for;
  // done first here, so that it does not undo the setting below.
  at::get_num_threads();
  if (!a.omp_set || !a.omp_get) return;
  active_ = true;
  omp_before_ = a.omp_get();
  a.omp_set(1);
}

SerialCpuOffHome::~SerialCpuOffHome() {
  if (!active_) return;
  const ThreadApi& a = api();
  if (omp_before_ > 0) a.omp_set(omp_before_);
}

}  // namespace torch_pjrt::eager
