"""accelerate / transformers: use tpu where they would fall back to CPU.

accelerate 1.15 and transformers 5.18 pick devices from fixed lists of named
backends (cuda, xpu, npu, mlu, musa, hpu, mps, neuron) and otherwise CPU; none
of them asks torch.accelerator, which does report tpu here. The one generic
knob, the ACCELERATE_TORCH_DEVICE environment variable, is not used: accelerate
reads it before its own `cpu=True`, so setting it by default would put
Accelerator(cpu=True) and TrainingArguments(use_cpu=True) on tpu.

Hence five narrow patches, each applied when its module is imported (nothing is
imported here) and each acting only where the library's own choice is CPU and a
tpu device is present (the library's choice stands in every other case):

1. accelerate.state.PartialState.default_device (accelerate/state.py:718):
   Accelerator().device, PartialState().device, hooks' execution device.
2. accelerate.utils.modeling.get_max_memory (accelerate/utils/modeling.py:757,
   no-argument case): device_map="auto" / "balanced" / "sequential" plan onto
   tpu devices (integer keys; torch.device(0) is tpu:0 here) with their free
   memory from torch.tpu.mem_get_info, the CPU budget kept after them.
3. transformers.TrainingArguments._setup_devices (transformers/training_args.py:1811,
   single-process branch at :1885): follows accelerate's choice (1), so
   args.device and the Trainer's model placement are tpu. In the same
   module, `is_torch_bf16_gpu_available` (utils/import_utils.py:636, named
   devices only) also answers for tpu, so `TrainingArguments(bf16=True)` no
   longer raises "Your setup doesn't support bf16/gpu" (:1746).
4. transformers.Pipeline.__init__ (transformers/pipelines/base.py:823-877):
   with no device=, a model already on tpu stays there and a CPU model goes to
   tpu (what the docstring promises for "the first available accelerator");
   a model dispatched with device_map onto tpu gets pipeline.device tpu:i
   rather than cpu.
5. accelerate.state.PartialState._prepare_backend (accelerate/state.py:755):
   under torchrun / `accelerate launch` (LOCAL_RANK set) accelerate finds no
   named accelerator and, without cpu=True, runs each rank as a lone process
   (num_processes 1, no DDP: every rank trains on its own, silently). With
   a tpu device present the launch becomes the generic multi-device kind
   (DistributedType.MULTI_GPU, whose code paths use `state.device`, not
   torch.cuda) on torch_pjrt's c10d backend "tpu", each rank on
   tpu:LOCAL_RANK; Accelerator.prepare wraps DDP and the Trainer follows.
   `accelerate launch` itself is left alone: with no config file it counts
   CUDA devices, and counting tpu devices would open the plugin in the
   launcher process (libtpu admits one process per chip), so multi-device
   runs say so: `accelerate launch --multi_gpu --num_processes N`, a config
   file from `accelerate config`, or torchrun.

Each would go away with the upstream change in docs/upstream_notes.md (ask
torch.accelerator.current_accelerator() before falling back to CPU).
"""
import functools
import inspect
import logging
import os
import sys

import torch

from . import _hooks

logger = logging.getLogger("torch_pjrt.integrations.hf")

_MARK = "_torch_pjrt_patched"


def _tpu_present():
    mod = getattr(torch, "tpu", None)
    try:
        return mod is not None and mod.is_available() and mod.device_count() > 0
    except Exception:  # a broken device must not break the library's own choice
        return False


def _tpu_device():
    return torch.device("tpu", torch.tpu.current_device())


def _mark(fn):
    setattr(fn, _MARK, True)
    return fn


# 1. accelerate: PartialState.default_device ------------------------------------------------

def _patch_accelerate_state(module):
    cls = module.PartialState
    original = cls.__dict__["default_device"]
    if getattr(original.fget, _MARK, False):
        return

    @_mark
    @functools.wraps(original.fget)
    def default_device(self):
        device = original.fget(self)
        if device.type == "cpu" and _tpu_present():
            return torch.device("tpu")
        return device

    cls.default_device = property(default_device, doc=original.__doc__)


# 5. accelerate: PartialState._prepare_backend (distributed launches) ------------------------

def _tpu_backend(backend):
    """True for no backend or one that handles tpu tensors ("tpu", its aliases,
    "cpu:gloo,tpu:tpu")."""
    from ..distributed import ALIASES, BACKEND
    return backend is None or backend in (BACKEND, *ALIASES) or any(
        part.split(":")[0].strip() == "tpu" for part in backend.split(",") if ":" in part)


def _patch_accelerate_backend(module):
    cls = module.PartialState
    original = cls.__dict__["_prepare_backend"]
    if getattr(original, _MARK, False):
        return
    distributed = module.DistributedType

    @_mark
    @functools.wraps(original)
    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, kind = original(self, cpu, sagemaker_dp, backend)
        local_rank = int(os.environ.get("LOCAL_RANK", -1))
        preset = getattr(self, "device", None)      # from ACCELERATE_TORCH_DEVICE
        if (kind != distributed.NO or cpu or local_rank == -1 or not _tpu_backend(backend)
                or (preset is not None and preset.type != "tpu") or not _tpu_present()):
            return chosen, kind
        # (What set_device does for the named devices, done here: it would
        # look up torch.cuda for MULTI_GPU.)
        if preset is None:
            self.device = torch.device("tpu", local_rank % torch.tpu.device_count())
        torch.tpu.set_device(self.device)
        from ..distributed import BACKEND
        backend = backend or BACKEND
        logger.info("torch_pjrt: distributed launch on %s with c10d backend %r", self.device, backend)
        return backend, distributed.MULTI_GPU

    cls._prepare_backend = _prepare_backend


# 2. accelerate: get_max_memory -------------------------------------------------------------

def _patch_get_max_memory(module):
    original = module.get_max_memory
    if getattr(original, _MARK, False):
        return

    @_mark
    @functools.wraps(original)
    def get_max_memory(max_memory=None):
        result = original(max_memory)
        if max_memory is None and _tpu_present() and not any(isinstance(k, int) for k in result):
            tpu = {}
            for i in range(torch.tpu.device_count()):
                try:
                    tpu[i] = int(torch.tpu.mem_get_info(i)[0])
                except Exception as e:
                    logger.warning("torch_pjrt: tpu:%d gives no free-memory figure (%s); device_map "
                                   "leaves it out", i, e)
            result = {**tpu, **result}     # devices first, as accelerate orders them
        return result

    module.get_max_memory = get_max_memory
    # With an explicit max_memory={0: ..., 1: ...} accelerate counts devices with
    # torch.cuda.device_count() and warns "Device 0 is not available, available
    # devices are []" for each tpu key (it still uses them); drop that false line.
    logging.getLogger(module.__name__).addFilter(_not_available_filter)
    # Names bound to the original before this ran (only when accelerate was
    # imported before torch_pjrt): accelerate.utils, big_modeling, transformers'.
    for name, attr in (("accelerate.utils", "get_max_memory"), ("accelerate.big_modeling", "get_max_memory"),
                       ("transformers.integrations.accelerate", "accelerate_max_memory")):
        other = sys.modules.get(name)
        if other is not None and getattr(other, attr, None) is original:
            setattr(other, attr, get_max_memory)


def _not_available_filter(record):
    msg = record.getMessage()
    if msg.startswith("Device ") and msg.endswith("is not available, available devices are []") and _tpu_present():
        try:
            return not 0 <= int(msg.split()[1]) < torch.tpu.device_count()
        except ValueError:
            return True
    return True


# 3. transformers: TrainingArguments._setup_devices -----------------------------------------

def _patch_training_args(module):
    cls = module.TrainingArguments
    original = cls.__dict__["_setup_devices"]
    func = getattr(original, "func", None)
    if func is None or getattr(func, _MARK, False):
        return

    @_mark
    @functools.wraps(func)
    def _setup_devices(self):
        device = func(self)
        state = getattr(self, "distributed_state", None)
        if (device.type == "cpu" and not self.use_cpu and state is not None
                and str(state.distributed_type).endswith("NO") and state.device.type == "tpu"):
            device = state.device
        return device

    prop = functools.cached_property(_setup_devices)
    prop.__set_name__(cls, "_setup_devices")
    cls._setup_devices = prop


def _patch_bf16_check(module):
    original = module.__dict__.get("is_torch_bf16_gpu_available")
    if original is None or getattr(original, _MARK, False):
        return

    @_mark
    @functools.wraps(original)
    def is_torch_bf16_gpu_available():
        return original() or (_tpu_present() and torch.tpu.is_bf16_supported())

    module.is_torch_bf16_gpu_available = is_torch_bf16_gpu_available


# 4. transformers: Pipeline.__init__ --------------------------------------------------------

def _accelerator_named_by_transformers():
    """True when transformers' own integer-device branch would pick a device, not CPU."""
    from transformers.utils import import_utils as iu
    checks = ("is_torch_mlu_available", "is_torch_musa_available", "is_torch_cuda_available",
              "is_torch_npu_available", "is_torch_hpu_available", "is_torch_mps_available")
    for name in checks:
        fn = getattr(iu, name, None)
        if fn is not None and fn():
            return True
    xpu = getattr(iu, "is_torch_xpu_available", None)
    return bool(xpu is not None and xpu(check_device=True))


def _patch_pipeline(module):
    cls = module.Pipeline
    original = cls.__init__
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)

    @_mark
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)
        model = bound.arguments.get("model")
        device_map = getattr(model, "hf_device_map", None)
        choose = (bound.arguments.get("device") is None and _tpu_present()
                  and not _accelerator_named_by_transformers())
        if choose and device_map is None:
            on = getattr(model, "device", None)
            bound.arguments["device"] = on if isinstance(on, torch.device) and on.type == "tpu" else _tpu_device()
            logger.info("torch_pjrt: pipeline device=None -> %s", bound.arguments["device"])
            return original(*bound.args, **bound.kwargs)
        original(*bound.args, **bound.kwargs)
        if choose and device_map and self.device.type == "cpu":
            first = next(iter(device_map.values()))
            if isinstance(first, int):          # accelerate's integer = tpu:first here
                self.device = torch.device("tpu", first)
            elif isinstance(first, (str, torch.device)) and torch.device(first).type == "tpu":
                self.device = torch.device(first)

    cls.__init__ = __init__


def install():
    _hooks.when_imported("accelerate.state", _patch_accelerate_state)
    _hooks.when_imported("accelerate.state", _patch_accelerate_backend)
    _hooks.when_imported("accelerate.utils.modeling", _patch_get_max_memory)
    _hooks.when_imported("transformers.training_args", _patch_training_args)
    _hooks.when_imported("transformers.training_args", _patch_bf16_check)
    _hooks.when_imported("transformers.pipelines.base", _patch_pipeline)
