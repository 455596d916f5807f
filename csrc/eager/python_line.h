// The Python line that called the current op, recorded cheaply (a code
// object and a line number) so that fused eager can name it when a trace
// fails later.
#pragma once

#include <string>

namespace torch_pjrt::eager {

struct PythonLine {
  void* code = nullptr;  // a PyCodeObject*, kept alive for the process
  int line = 0;
};

// The innermost frame outside torch and torch_pjrt (or the innermost one);
// empty on a thread with no Python frames (autograd's backward thread).
PythonLine current_python_line();
// "path/to/file.py:12 in fn", or "" (takes the GIL).
std::string describe(const PythonLine& where);

}  // namespace torch_pjrt::eager
