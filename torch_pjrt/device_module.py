"""torch.tpu: the device module PyTorch looks up for the `tpu` device."""
import collections
import contextlib
import functools
import sys

import torch

from . import _state


def _C():
    return _state.C


def is_available():
    return _state.C is not None and _C().device_count() > 0


def is_initialized():
    """False in a forked child (as torch.cuda.is_initialized)."""
    return _state.C is not None and not _is_in_bad_fork()


def __getattr__(name):
    # torch.utils.checkpoint saves and restores a device's RNG state only if
    # `device_module._initialized` (torch.cuda's flag): without it dropout in a
    # checkpointed region got another mask when recomputed (wrong gradients).
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


def _is_in_bad_fork():
    """True in a child made by fork() after the parent started the PJRT client:
    tpu use raises there (use the spawn start method). torch.manual_seed asks."""
    return _state.C is not None and _C().in_bad_fork()


def _lazy_init():
    # The runtime starts at import; in a forked child this raises the
    # "use the spawn start method" error, as torch.cuda's lazy init does.
    if _is_in_bad_fork():
        _C().check_usable()


def init():
    _lazy_init()


def device_count():
    return _C().device_count()


def current_device():
    return _C().current_device()


def _index(device, all_devices=False):
    """The device index `device` names, checked against the devices there are
    (-1, all devices, where `all_devices`)."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        index = current_device() if device.index is None else device.index
    count = device_count()
    if not 0 <= index < count and not (all_devices and index == -1):
        raise RuntimeError(f"torch_pjrt: invalid device index {index}: plugin '{_C().plugin_info()['name']}' "
                           f"has {count} device(s)")
    return index


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


def device_of(obj):
    """As torch.cuda.device_of: the current device is `obj`'s for the block
    when `obj` is a tpu tensor (or storage); otherwise unchanged."""
    if getattr(obj, "device", None) is not None and obj.device.type == "tpu":
        return device(obj.device)
    return contextlib.nullcontext()


# As torch.cuda.OutOfMemoryError (code catches it by the device module's name).
OutOfMemoryError = torch.OutOfMemoryError


def synchronize(device=None):
    """Waits for every program launched on the device (all devices if None given as -1)."""
    _C().synchronize(_index(device, all_devices=True))


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
    memory_allocated: there is no caching allocator of ours in between.
    torch.accelerator.memory_reserved() gives the same figure."""
    return _C().memory_reserved(_index(device))


def max_memory_reserved(device=None):
    """The peak of memory_reserved since start or reset_peak_memory_stats."""
    return _C().max_memory_reserved(_index(device))


def reset_max_memory_allocated(device=None):
    """As torch.cuda's (an alias of reset_peak_memory_stats)."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None):
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None):
    """Zeroes the allocated/freed totals of memory_stats() (the *.allocated / *.freed keys)."""
    _C().reset_accumulated_memory_stats(_index(device))


def empty_cache():
    """Lets go at once of the buffers that finished queued executions still
    hold. There is no cache of freed memory to release: a buffer is freed when
    its last tensor (and the last execution using it) lets go of it."""
    if _state.C is not None:
        _C().empty_cache()


def memory_summary(device=None, abbreviated=False):
    """A short text report of memory_stats() (not torch.cuda's full table)."""
    i = _index(device)
    s = memory_stats(i)

    def mib(n):
        return f"{n / 2**20:,.1f} MiB"

    lines = [f"tpu:{i} memory summary ({get_device_name(i)})",
             f"  allocated:      {mib(s['allocated_bytes'])} (peak {mib(s['peak_allocated_bytes'])})",
             f"  reserved:       {mib(memory_reserved(i))} (peak {mib(max_memory_reserved(i))})",
             f"  held by queue:  {mib(s['held_by_queue_bytes'])} in {s['queued_executions']} queued execution(s)",
             f"  limit / total:  {mib(s['limit_bytes'])} / {mib(s['total_bytes'])}"]
    if not abbreviated:
        lines.append(f"  buffers:        {s.get('allocation.all.current', 0)} live, "
                     f"{s.get('allocation.all.allocated', 0)} created, {s.get('allocation.all.freed', 0)} freed")
    return "\n".join(lines) + "\n"


def memory_stats(device=None):
    """allocated_bytes (every live device buffer: tensors' storages and buffers
    only queued work still holds; a tensor counts from its first write),
    peak_allocated_bytes, held_by_queue_bytes, queued_executions, limit_bytes,
    total_bytes, and the plugin's own plugin_* figures where it reports them;
    plus PyTorch's allocator keys ("allocated_bytes.all.current", ...) as
    torch.accelerator.memory_stats() gives them (only the "all" pool is counted)."""
    i = _index(device)
    stats = dict(_C().memory_stats(i))
    stats.update(_C().allocator_stats(i))
    return stats


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
    and total_memory in bytes (the plugin's figure; host RAM for the CPU plugin).
    CUDA-only attributes (major, minor, multi_processor_count, ...) are absent."""
    i = _index(device)
    info = _C().plugin_info()
    kind = _C().device_kind(i)
    return _DeviceProperties(name=f"{kind} ({info['platform']})", type="tpu", kind=kind,
                             platform=info["platform"], total_memory=_C().total_memory(i))


def is_bf16_supported(including_emulation=True):
    """True: every PJRT plugin (XLA CPU, CUDA, TPU) computes in bfloat16."""
    return is_available()


# ---- streams and events ----
#
# A device has one queue: it runs what is launched on it in order, and PJRT
# makes each execution wait for the buffers it reads (across devices too), so
# wait_event / wait_stream need not wait. Streams are PyTorch's (their own
# ids, the default one 0, a current one per thread and device, as CUDA's), all
# on that queue: code written for several streams runs correctly, without
# overlap between them. Events mark the work launched so far on a device: an
# event completes when that work has completed and is timed then (device
# time, milliseconds). torch.Stream / torch.Event(device="tpu") and
# torch.accelerator's stream calls use the same implementation
# (csrc/device/guard.cpp).

def _tpu_device(device):
    return torch.device("tpu", _index(device))


class Stream(torch.Stream):
    """torch.cuda.Stream's surface: a new stream of the device (its queue)."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if kwargs:  # torch.Stream(stream_id=..., device_index=..., device_type=...)
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_tpu_device(device), priority=priority)

    def wait_event(self, event):
        _base_event(event).wait(self)

    def wait_stream(self, stream):
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def tpu_stream(self):
        return self.stream_id


def _base_event(event):
    return event._event if isinstance(event, Event) else event


class Event:
    """torch.cuda.Event's surface over a torch.Event(device="tpu"):
    record(stream=None), query(), wait(stream=None), synchronize(),
    elapsed_time(end) in milliseconds between the two completions. (A wrapper,
    not a subclass: torch.Event.elapsed_time accepts only torch.Event itself.)"""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self._event = torch.Event(device=torch.device("tpu"), enable_timing=enable_timing,
                                  blocking=blocking, interprocess=interprocess)

    def record(self, stream=None):
        self._event.record(current_stream() if stream is None else stream)

    def wait(self, stream=None):
        self._event.wait(current_stream() if stream is None else stream)

    def query(self):
        return self._event.query()

    def synchronize(self):
        self._event.synchronize()

    def elapsed_time(self, end_event):
        return self._event.elapsed_time(_base_event(end_event))

    @property
    def device(self):
        return self._event.device

    @property
    def event_id(self):
        return self._event.event_id

    def __repr__(self):
        return f"torch.tpu.Event({self._event!r})"


def _as_tpu_stream(s):
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None):
    """The thread's current stream of the device (the default stream unless set)."""
    return _as_tpu_stream(torch.accelerator.current_stream(_tpu_device(device)))


def default_stream(device=None):
    d = _tpu_device(device)
    kind = torch.accelerator.current_stream(d).device_type
    return Stream(stream_id=0, device_index=d.index, device_type=kind)


def set_stream(stream):
    """Makes `stream` current (and its device, as torch.cuda.set_stream)."""
    if stream is None:
        return
    if stream.device.type != "tpu":
        raise ValueError(f"Expected a tpu stream, but got: {stream}")
    torch.accelerator.set_stream(stream)


class StreamContext:
    """`with torch.tpu.stream(s):` (s may be None): s's device and s are
    current inside; both come back on exit."""

    def __init__(self, stream):
        if stream is not None and stream.device.type != "tpu":
            raise ValueError(f"Expected a tpu stream, but got: {stream}")
        self.stream = stream
        self._saved = None

    def __enter__(self):
        if self.stream is not None:
            device = current_device()
            self._saved = (device, current_stream(device), current_stream(self.stream.device_index))
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self._saved is not None:
            device, here, there = self._saved
            torch.accelerator.set_stream(there)
            torch.accelerator.set_stream(here)
            set_device(device)
            self._saved = None
        return False


def stream(stream):
    return StreamContext(stream)


def _host_only(fn):
    """The generator functions run on the host, never traced: Dynamo would
    inline them (torch.testing's freeze_rng_state calls them under
    no_dispatch inside compiled code, which then failed) and graph-breaks
    around them instead, as around torch.cuda's. torch._disable_dynamo
    imports Dynamo at the first call (1.2 s, each DataLoader worker seeds),
    so the plain function runs while Dynamo is not imported: then nothing
    can be tracing."""
    disabled = torch._disable_dynamo(fn)

    @functools.wraps(fn)
    def host_only(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        return disabled(*args, **kwargs)
    return host_only


def default_generator(device=None):
    """The device's default generator (what torch.manual_seed seeds)."""
    return _C().default_generator(_index(device))


@_host_only
def manual_seed(seed):
    default_generator().manual_seed(int(seed))


@_host_only
def manual_seed_all(seed):
    for i in range(device_count()):
        default_generator(i).manual_seed(int(seed))


@_host_only
def seed():
    return default_generator().seed()


@_host_only
def initial_seed():
    return default_generator().initial_seed()


@_host_only
def get_rng_state(device=None):
    return default_generator(device).get_state()


@_host_only
def set_rng_state(state, device=None):
    default_generator(device).set_state(state)


@_host_only
def seed_all():
    """One new random seed, set on every device (as torch.cuda.seed_all)."""
    value = default_generator(0).seed()
    for i in range(1, device_count()):
        default_generator(i).manual_seed(value)


@_host_only
def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


@_host_only
def set_rng_state_all(new_states):
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]
