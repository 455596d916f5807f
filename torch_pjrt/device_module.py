"""torch.tpu: the device module PyTorch looks up for the `tpu` device."""
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
    return False


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
