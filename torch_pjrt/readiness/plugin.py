"""libtpu as a compile-only plugin, beside the plugin that runs tensors.

Found as the `libtpu` package (`pip install libtpu==0.0.42.1`, an optional
extra: torch_pjrt runs without it) or at TORCH_PJRT_LIBTPU. Loaded once per
process, with a deadline on its start-up (runtime/topology_compiler.cpp)."""
import functools
import importlib.util
import os

from .. import _state

LIBTPU_PIN = "libtpu==0.0.42.1"
START_TIMEOUT_S = float(os.environ.get("TORCH_PJRT_LIBTPU_TIMEOUT", "120"))


class LibtpuMissing(RuntimeError):
    """libtpu is not installed: readiness cannot compile for a TPU."""


def libtpu_path():
    """The libtpu shared object, or None."""
    env = os.environ.get("TORCH_PJRT_LIBTPU")
    if env:
        return env if os.path.isfile(env) else None
    spec = importlib.util.find_spec("libtpu")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
    return path if os.path.isfile(path) else None


def install_hint():
    return (f"libtpu is not installed, so nothing can be compiled for a TPU here: `pip install {LIBTPU_PIN}` "
            "(or set TORCH_PJRT_LIBTPU to a libtpu.so); no TPU is needed")


def available():
    return libtpu_path() is not None


@functools.lru_cache(maxsize=1)
def plugin():
    path = libtpu_path()
    if path is None:
        raise LibtpuMissing(install_hint())
    return _state.C.CompileOnlyPlugin(path, START_TIMEOUT_S)


@functools.lru_cache(maxsize=None)
def topology(name, chips_per_host_bounds=None, num_slices=None):
    """A topology description ("v5e:2x2"), with libtpu's options where given."""
    options = {}
    if chips_per_host_bounds:
        options["chips_per_host_bounds"] = list(chips_per_host_bounds)
    if num_slices:
        options["num_slices"] = int(num_slices)
    try:
        return plugin().topology(name, options)
    except ValueError as e:
        # A slice smaller than libtpu's default host (2x2x1), e.g. "v5e:1x1":
        # the host is the slice itself.
        dims = name.rsplit(":", 1)[-1].split("x")
        if chips_per_host_bounds or "not divisible" not in str(e) or not all(d.isdigit() for d in dims):
            raise
        bounds = [int(d) for d in dims] + [1] * (3 - len(dims))
        return plugin().topology(name, dict(options, chips_per_host_bounds=bounds[:3]))
