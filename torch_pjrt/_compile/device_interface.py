"""Dynamo's device interface for "tpu": torch.tpu as Dynamo and Inductor see it.

torch 2.13 registers its own TpuInterface under "tpu" (for another TPU
package): device_count, synchronize, current_stream and memory_allocated
raise NotImplementedError there, and float16/float64 read as unsupported.
`install()` (from torch_pjrt/__init__.py) puts this one in its place when
torch._dynamo.device_interface is imported, without importing Dynamo itself.
"""
import torch

from ..integrations import _hooks


def _tpu():
    return torch.tpu


def _supported_dtypes():
    # The device's own list (torch 2.10+); before it, what dtype_map.h takes.
    if hasattr(torch.accelerator, "get_device_capability"):
        return torch.accelerator.get_device_capability(_tpu().current_device())["supported_dtypes"]
    return {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
            torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
            torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
            torch.float8_e5m2fnuz}


def _make_interface(base):
    """A subclass of Dynamo's DeviceInterface (made once Dynamo is imported)."""
    tpu = _tpu()

    class TpuWorker:
        @staticmethod
        def set_device(device):
            tpu.set_device(device)

        @staticmethod
        def current_device():
            return tpu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return tpu.get_device_properties(device)

    class Interface(base):
        device = tpu.device
        Event = torch.Event  # Dynamo captures torch.Event subclasses only
        Stream = tpu.Stream
        Worker = TpuWorker

        @staticmethod
        def current_device():
            return tpu.current_device()

        @staticmethod
        def set_device(device):
            tpu.set_device(device)

        @staticmethod
        def maybe_exchange_device(device):
            return Interface.exchange_device(device)

        @staticmethod
        def exchange_device(device):
            old = tpu.current_device()
            if device >= 0 and device != old:
                tpu.set_device(device)
            return old

        @staticmethod
        def device_count():
            return tpu.device_count()

        @staticmethod
        def is_available():
            return tpu.is_available()

        # torch.tpu's own functions (Dynamo recognizes them by identity).
        stream = staticmethod(tpu.stream)
        current_stream = staticmethod(tpu.current_stream)
        set_stream = staticmethod(tpu.set_stream)

        @staticmethod
        def _set_stream_by_id(stream_id, device_index, device_type):
            tpu.set_stream(tpu.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx):
            return tpu.current_stream(device_idx).stream_id

        @staticmethod
        def synchronize(device=None):
            tpu.synchronize(device)

        @staticmethod
        def get_compute_capability(device=None):
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation=False):
            return True

        @classmethod
        def is_dtype_supported(cls, dtype, including_emulation=False):
            return dtype in _supported_dtypes()

        @staticmethod
        def memory_allocated(device=None):
            return tpu.memory_allocated(device)

    Interface.__name__ = Interface.__qualname__ = "TpuPjrtInterface"
    return Interface


def _register(module):
    if not getattr(module, "_device_initialized", True):
        module.init_device_reg()  # the built-in ones first, so they do not replace ours later
    interface = _make_interface(module.DeviceInterface)
    module.register_interface_for_device("tpu", interface)
    for i in range(_tpu().device_count()):
        module.register_interface_for_device(f"tpu:{i}", interface)


def install():
    _hooks.when_imported("torch._dynamo.device_interface", _register)
