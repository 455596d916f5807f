"""Post-import hooks: run a function on a module right after it is executed.

`when_imported(name, fn)` calls fn(module) now if `name` is already imported,
else once the module has been executed by the normal import machinery (a
meta-path finder that wraps the loader found by the other finders; the module
itself, its spec and its loader's other behaviour are unchanged).
"""
import importlib.abc
import sys
import threading

_pending = {}          # module name -> [fn, ...]
_lock = threading.Lock()
_finder = None


def when_imported(name, fn):
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            _pending.setdefault(name, []).append(fn)
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
            return
    fn(module)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def __getattr__(self, attr):            # get_source, get_resource_reader, ...
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        with _lock:
            fns = _pending.pop(self._name, [])
        for fn in fns:
            fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    _busy = threading.local()

    def find_spec(self, name, path, target=None):
        if name not in _pending or getattr(self._busy, "name", None) == name:
            return None
        self._busy.name = name
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.name = None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, name)
        return spec
