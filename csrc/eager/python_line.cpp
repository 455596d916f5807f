#include "eager/python_line.h"

#include <Python.h>
#include <frameobject.h>

#include <unordered_map>

namespace torch_pjrt::eager {
namespace {

// Per code object (under the GIL): whether it belongs to torch or
// torch_pjrt. Each code object seen is kept alive, so pointers stay valid.
bool is_library(PyCodeObject* code) {
  static auto* known = new std::unordered_map<PyCodeObject*, bool>();
  auto it = known->find(code);
  if (it != known->end()) return it->second;
  bool lib = false;
  if (const char* f = PyUnicode_AsUTF8(code->co_filename)) {
    std::string file(f);
    lib = file.find("/torch/") != std::string::npos || file.find("/torch_pjrt/") != std::string::npos ||
          file.rfind("<frozen", 0) == 0;
  } else {
    PyErr_Clear();
  }
  Py_INCREF(code);
  known->emplace(code, lib);
  return lib;
}

}  // namespace

PythonLine current_python_line() {
  PythonLine out;
  if (!Py_IsInitialized()) return out;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  bool first = true;
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    bool lib = is_library(code);
    if (first || !lib) {
      out.code = code;
      out.line = PyFrame_GetLineNumber(frame);
    }
    Py_DECREF(code);
    first = false;
    if (!lib) {
      Py_DECREF(frame);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  PyGILState_Release(gil);
  return out;
}

std::string describe(const PythonLine& where) {
  if (!where.code || !Py_IsInitialized()) return "";
  PyGILState_STATE gil = PyGILState_Ensure();
  auto* code = static_cast<PyCodeObject*>(where.code);
  std::string out;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* name = PyUnicode_AsUTF8(code->co_name);
  if (file && name) out = std::string(file) + ":" + std::to_string(where.line) + " in " + name;
  PyErr_Clear();
  PyGILState_Release(gil);
  return out;
}

}  // namespace torch_pjrt::eager
