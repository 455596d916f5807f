"""torch_pjrt: a native PyTorch device ("tpu") over any PJRT plugin.

Importing this package loads the PJRT plugin (env TORCH_PJRT_PLUGIN, or the
best one installed), renames PyTorch's PrivateUse1 backend to "tpu" and
registers torch.tpu. With torch_pjrt installed (or in dev mode, its
dist-info on the path), `import torch` already does it: PyTorch imports each
"torch.backends" entry point (ours: _autoload) at the end of its own import.
"""
import atexit
import os
import sys
import time
import warnings

_autoload_error = None  # what failed when `import torch` loaded torch_pjrt


def _autoload():
    """The "torch.backends" entry point, which `import torch` calls after
    importing torch_pjrt: the import has registered the device already.
    Defined before `import torch`: when `import torch_pjrt` comes first, torch's
    autoload finds this half-imported package and calls this (nothing to do)."""
    if _autoload_error is None:
        return
    err = _autoload_error
    plugin = (" at ".join(_chosen_plugin) if _chosen_plugin
              else os.environ.get("TORCH_PJRT_PLUGIN") or "not chosen yet")
    # Forget the half-imported package: `import torch_pjrt` tries again (and raises).
    for name in [n for n in sys.modules if n == __name__ or n.startswith(__name__ + ".")]:
        del sys.modules[name]
    warnings.warn(
        f"torch_pjrt: the tpu device is not available, loading torch_pjrt failed at `import torch`: "
        f"{type(err).__name__}: {err} (PJRT plugin: {plugin}). "
        "`import torch_pjrt` raises the error; TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops `import torch` "
        "from loading torch_pjrt.", RuntimeWarning, stacklevel=2)


import torch  # noqa: E402

from . import _loader, _plugin, _state, device_module

__all__ = ["metrics", "plugin_info", "supported_ops", "clear_executable_cache", "bucketed", "next_bucket",
           "set_memory_limit", "memory_limit", "set_executable_cache_bounds", "executable_cache_bounds",
           "checks_enabled", "set_checks", "fused", "capture_step", "CapturedStep"]


_chosen_plugin = []  # [name, path] of the PJRT plugin being loaded


def _initialize():
    C = _loader.load_extension()
    name, path = _plugin.choose(C)
    _chosen_plugin[:] = [name, path]
    topics = {t.strip() for t in os.environ.get("TORCH_PJRT_LOG", "").split(",") if t.strip()}
    if topics - {"recompiles", "graphs"}:
        import warnings
        warnings.warn(f"torch_pjrt: TORCH_PJRT_LOG names unknown topics {sorted(topics - {'recompiles', 'graphs'})} "
                      "(known: recompiles, graphs)", RuntimeWarning, stacklevel=2)
    raw = os.environ.get("TORCH_PJRT_CPU_DEVICES", "2")
    try:
        cpu_devices = int(raw)
    except ValueError:
        cpu_devices = 0
    if cpu_devices < 1:
        raise RuntimeError(f"torch_pjrt: TORCH_PJRT_CPU_DEVICES must be a whole number >= 1 (the CPU plugin's "
                           f"devices), got {raw!r}")
    # XLA logs informational lines on stderr while the plugin starts (e.g.
    # "cpu_device_count set via create_options"); quiet unless the user set
    # a level. Only for the start-up: the variable is put back afterwards.
    user_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    quiet = not user_level  # unset or empty
    if quiet:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    try:
        C.init(path, name, cpu_devices)
    finally:
        if quiet:
            if user_level is None:
                os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
            else:
                os.environ["TF_CPP_MIN_LOG_LEVEL"] = user_level
    _state.C = C
    torch.utils.rename_privateuse1_backend("tpu")
    torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    # Module.to_empty(device="tpu") of a meta model must keep tied parameters
    # tied (a GPT's embedding and head): `param.data = ` cannot take a meta
    # tensor, so PyTorch would make new Parameters; those conversions swap the
    # tensors' contents instead, on their own thread, with no process-wide
    # setting (_module_conversion.py).
    from . import _module_conversion
    _module_conversion.install()
    # Shape inference for the fused GRU cell ops RNN layers use on tpu.
    from . import _rnn_meta
    _rnn_meta.install()
    # aten::_grouped_mm's Meta kernel for float32 (transformers' MoE layers).
    from . import _grouped_mm_meta
    _grouped_mm_meta.install()


def _in_torch_autoload():
    """Whether this import comes from `import torch` (torch/__init__.py's
    _import_device_backends, which loads the "torch.backends" entry points)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_import_device_backends" and f.f_globals.get("__name__") == "torch":
            return True
        f = f.f_back
    return False


try:
    _initialize()
except Exception as err:  # noqa: BLE001
    # A broken plugin or build must not break `import torch` for every user
    # of this environment (PyTorch would turn it into a RuntimeError): at
    # autoload it is a warning (see _autoload), `import torch_pjrt` raises it.
    if not _in_torch_autoload():
        raise
    _autoload_error = err

if _autoload_error is None:
    from . import _compile  # noqa: E402  (needs the extension loaded)
    from .bucketing import bucketed, next_bucket  # noqa: E402,F401
    # accelerate / transformers pick tpu where they would fall back to CPU;
    # applied when they are imported (nothing imported here).
    from .integrations import install as _install_integrations  # noqa: E402
    _install_integrations()
    from . import distributed as _distributed  # noqa: E402
    _distributed.register()  # init_process_group(backend="tpu")
    from ._compile import device_interface as _device_interface  # noqa: E402
    _device_interface.install()  # Dynamo's device interface for "tpu", once Dynamo is imported
    from . import _legacy_save  # noqa: E402
    _legacy_save.install()  # pickle.dumps / legacy torch.save and load of tpu tensors, through a CPU copy
    from . import _mp_reductions  # noqa: E402
    _mp_reductions.install()  # torch.multiprocessing sends tpu tensors as copies (no IPC for PJRT buffers)
    from . import _dlpack  # noqa: E402
    _dlpack.install()  # DLPack export of tpu tensors: a BufferError, not a capsule of a handle

    # torch.compile(backend="tpu"): registered when Dynamo is imported (now, if
    # it is loaded), so importing torch_pjrt does not import Dynamo (~1 s). The
    # entry point in torch_pjrt-0.1.0.dist-info finds it too; a bare PYTHONPATH
    # has no dist-info (transformers compiles tpu decoding with backend="tpu").
    from .integrations import _hooks  # noqa: E402
    _hooks.when_imported("torch._dynamo", lambda _module: _compile.register())


@atexit.register
def _let_compiles_finish():
    # Programs still compiling on compile threads (a fused trace's can take
    # XLA seconds) finish first: the C exit handlers after the interpreter's
    # run XLA's static destructors, and a compile running then crashes.
    if _state.C is not None and _state.C.initialized():
        _state.C.wait_for_compiles()


@atexit.register
def _let_autograd_threads_finish():
    # PyTorch's autograd device threads (one per tpu) drop a finished
    # backward's state, which holds Python objects, just after backward()
    # returns. If the interpreter is finalizing by then, taking the GIL ends the
    # thread with a forced unwind and the process aborts ("terminate called
    # without an active exception", pytorch/pytorch#38228). Give them a moment
    # while the interpreter is still whole.
    time.sleep(0.05)


def metrics():
    """Counters of this process: xla_compiles, executable_cache_hits, executions,
    host_to_device_bytes, device_to_host_bytes, ...; for torch.compile:
    dynamo_graphs, dynamo_recompiles, compiled_graphs, graph_recompiles, ..."""
    m = dict(_state.C.metrics())
    m.update(_compile.COUNTERS)
    m.update(_state.C.distributed_metrics())
    m.update(_state.C.capture_metrics())
    return m


class fused:
    """Fused eager for a region: ``with torch_pjrt.fused(): ...``.

    Ops on tpu tensors are recorded instead of launched; the recorded trace runs
    as one XLA program when something needs its values (a host read,
    ``synchronize``, a CPU fallback, a size bound) and when the region ends.
    Semantics are those of strict eager. The setting is process-wide while a
    region is open (autograd's backward runs on its own thread), and
    ``TORCH_PJRT_EAGER=fused`` turns it on everywhere. Also a decorator.

    ``pipeline``: pipelined flushes (a repeating trace cut after the value a
    read needs, the rest run without the read waiting; default from
    ``TORCH_PJRT_FUSED_PIPELINE``, on) switched on or off while the region is
    open (process-wide, like the region)."""

    def __init__(self, pipeline=None):
        if pipeline is not None and not isinstance(pipeline, bool):
            raise TypeError(f"torch_pjrt.fused: pipeline must be a bool or None, got {type(pipeline).__name__}")
        self._pipeline = pipeline
        self._was = []  # the pipeline setting each open use of this instance replaced (nesting)

    def __enter__(self):
        if torch.compiler.is_compiling():  # inside torch.compile the graph is one program already
            return self
        if self._pipeline is not None:
            self._was.append(_state.C.set_fused_pipeline(self._pipeline))
        _state.C.fused_enter()
        return self

    def __exit__(self, *exc):
        if torch.compiler.is_compiling():
            return False
        try:
            _state.C.fused_leave()  # (RuntimeError for an exit with no region open)
        finally:
            if self._pipeline is not None and self._was:
                _state.C.set_fused_pipeline(self._was.pop())
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with fused(self._pipeline):
                return fn(*args, **kwargs)

        return wrapper


from .step_capture import CapturedStep, capture_step  # noqa: E402


def fused_flush():
    """Runs the pending fused trace now (nothing when there is none)."""
    _state.C.fused_flush()


def fused_active():
    """Whether ops are being recorded (fused eager) right now."""
    return bool(_state.C.fused_active())


def plugin_info():
    """The loaded PJRT plugin: name, path, platform, API version, attributes."""
    return dict(_state.C.plugin_info())


def supported_ops():
    """ATen op names (base name or name.overload) that have a lowering."""
    return list(_state.C.registered_lowerings())


def supported_ops_table():
    """(name, family, needs_random_state) for every lowering, sorted by name."""
    return [tuple(r) for r in _state.C.lowering_table()]


def clear_executable_cache():
    """Drops every compiled program held in memory: the per-op executables and
    fused eager's traces with their programs (the persistent cache on disk is
    kept; see torch_pjrt.cache)."""
    _state.C.clear_executable_cache()


def executable_cache_bounds():
    """(max entries, max bytes) of the in-memory executable cache; 0 = no bound."""
    return tuple(_state.C.executable_cache_bounds())


def set_executable_cache_bounds(max_entries=None, max_bytes=None):
    """Bounds the in-memory executable cache (LRU; also set by
    TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES / _BYTES); 0 = no bound."""
    entries, nbytes = executable_cache_bounds()
    entries = entries if max_entries is None else int(max_entries)
    nbytes = nbytes if max_bytes is None else int(max_bytes)
    if entries < 0 or nbytes < 0:
        raise ValueError(f"torch_pjrt: cache bounds must be >= 0 (0: no bound), got {entries} entries, {nbytes} bytes")
    _state.C.set_executable_cache_bounds(entries, nbytes)


def checks_enabled():
    """Whether ops check index ranges and integer division by zero in their
    programs (reported at the next host read); TORCH_PJRT_CHECKS sets the start value."""
    return bool(_state.C.checks_enabled())


def set_checks(enabled):
    """Turns the in-program value checks on or off for programs run from now on
    (each setting has its own programs; debug mode always checks)."""
    if not isinstance(enabled, bool):  # (bool("off") is True)
        raise TypeError(f"torch_pjrt.set_checks: enabled must be a bool, got {enabled!r}")
    _state.C.set_checks_enabled(enabled)


def memory_limit(device=None):
    """The memory limit of a tpu device in bytes (0: the device's own size)."""
    return _state.C.memory_limit(device_module._index(device))


def _parse_bytes(text, what):
    from .cache import parse_size
    try:
        size = parse_size(text)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    return 0 if size is None else size


def set_memory_limit(nbytes, device=None):
    """Makes the device behave as one with `nbytes` of memory (all devices
    when device is None): allocations past it raise torch.OutOfMemoryError.
    0 removes the limit; a size text ("8GiB", "500M") is read as the cache CLI's.
    TORCH_PJRT_MEMORY_LIMIT sets it at start-up."""
    if isinstance(nbytes, str):
        nbytes = _parse_bytes(nbytes, "torch_pjrt.set_memory_limit")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or \
            (isinstance(nbytes, float) and not nbytes.is_integer()):  # (1.5 became a 1-byte limit)
        raise TypeError(f"torch_pjrt.set_memory_limit: nbytes must be a whole number of bytes or a size such as "
                        f"'1G', got {nbytes!r}")
    if int(nbytes) < 0:
        raise ValueError(f"torch_pjrt: a memory limit must be >= 0 bytes (0: none), got {nbytes}")
    devices = range(device_module.device_count()) if device is None else [device_module._index(device)]
    for d in devices:
        _state.C.set_memory_limit(d, int(nbytes))
