"""torch.tpu: the device module PyTorch looks up for the `tpu` device."""
import collections
import contextlib

import torch

from . import _state


def _C():
    return _state.C


def is_available():
    return _state.C is not None and _C().device_count() > 0


def is_initialized():
    return _state.C is not None


def _is_in_bad_fork():
    """True in a child made by fork() after the parent started the PJRT client:
    tpu use raises there (use the spawn start method). torch.manual_seed asks."""
    return _state.C is not None and _C().in_bad_fork()


def _lazy_init():
    pass


def init():
    pass


def device_count():
    return _C().device_count()


def current_device():
    return _C().current_device()


def _index(device):
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
    return current_device() if device.index is None else device.index


def set_device(device):
    _C().set_device(_index(device))


@contextlib.contextmanager
def device(dev):
    previous = current_device()
    set_device(dev)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device=None):
    """Waits for every program launched on the device (all devices if None given as -1)."""
    _C().synchronize(_index(device))


def get_device_name(device=None):
    """The PJRT plugin's platform name, e.g. "cpu", "cuda" or "tpu"."""
    _index(device)
    return _C().plugin_info()["platform"]


def get_device_kind(device=None):
    return _C().device_kind(_index(device))


def memory_allocated(device=None):
    return _C().memory_allocated(_index(device))


def max_memory_allocated(device=None):
    return _C().max_memory_allocated(_index(device))


def reset_peak_memory_stats(device=None):
    _C().reset_peak_memory_stats(_index(device))


def memory_reserved(device=None):
    """What the plugin's allocator holds when it says (bytes_reserved), else
    memory_allocated: there is no caching allocator of ours in between."""
    s = memory_stats(device)
    return s.get("plugin_bytes_reserved") or s["allocated_bytes"]


def memory_stats(device=None):
    """allocated_bytes (every live device buffer: tensors' storages and buffers
    only queued work still holds; a tensor counts from its first write),
    peak_allocated_bytes, held_by_queue_bytes, queued_executions, limit_bytes,
    total_bytes, and the plugin's own plugin_* figures where it reports them."""
    return dict(_C().memory_stats(_index(device)))


def mem_get_info(device=None):
    """(free, total) bytes, as torch.cuda.mem_get_info: within the memory
    limit when one is set, else the plugin's figures (host RAM for the CPU plugin)."""
    return tuple(_C().mem_get_info(_index(device)))


def set_per_process_memory_fraction(fraction, device=None):
    """Makes the device behave as one with `fraction` of its memory
    (allocations past it raise torch.OutOfMemoryError), as the CUDA call does."""
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    i = _index(device)
    total = _C().total_memory(i)
    if total <= 0:
        raise RuntimeError(f"torch_pjrt: plugin {_C().plugin_info()['name']!r} does not report the memory "
                           "size of the device; use torch_pjrt.set_memory_limit(bytes)")
    _C().set_memory_limit(i, int(fraction * total))


def get_per_process_memory_fraction(device=None):
    i = _index(device)
    total, limit = _C().total_memory(i), _C().memory_limit(i)
    return 1.0 if not limit or not total else limit / total


_DeviceProperties = collections.namedtuple("_DeviceProperties", "name type kind platform total_memory")


def get_device_properties(device=None):
    """name, type ("tpu"), kind (the PJRT device kind), platform (the plugin's)
    and total_memory in bytes (the plugin's figure; host RAM for the CPU plugin)."""
    i = _index(device)
    info = _C().plugin_info()
    kind = _C().device_kind(i)
    return _DeviceProperties(name=f"{kind} ({info['platform']})", type="tpu", kind=kind,
                             platform=info["platform"], total_memory=_C().total_memory(i))


def default_generator(device=None):
    """The device's default generator (what torch.manual_seed seeds)."""
    return _C().default_generator(_index(device))


def manual_seed(seed):
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed):
    for i in range(device_count()):
        default_generator(i).manual_seed(int(seed))


def seed():
    return default_generator().seed()


def initial_seed():
    return default_generator().initial_seed()


def get_rng_state(device=None):
    return default_generator(device).get_state()


def set_rng_state(state, device=None):
    default_generator(device).set_state(state)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]
