"""Module.to("tpu") / .tpu() / .to_empty(device="tpu") / .cpu() keep tied
parameters tied, with no process-wide setting.

Between CPU and tpu tensors PyTorch's own path, `param.data = converted`,
works (csrc/device/shallow_copy.cpp) and keeps every Parameter object, so ties,
optimizers built before the move and hooks on the parameters all survive, as
between CPU and CUDA. It refuses meta tensors (`to_empty(device="tpu")` of a
model built on the meta device), and then makes a new Parameter per module,
so a tied embedding and head come apart. Those conversions swap the tensors'
contents instead (torch.utils.swap_tensors, PyTorch's
`torch.__future__.set_swap_module_params_on_conversion(True)`), which keeps
every Parameter object. (A swap leaves hooks registered on a parameter with
the old tensor, so it is not used where it is not needed.) Setting that flag
for the whole process would also change load_state_dict everywhere (it swaps
too, and fails on RNN modules, whose parameters have weak references), so
the swap is scoped:

- Module._apply is wrapped: a conversion to or from tpu of a module that
  holds a meta tensor runs with the swap on for this thread only;
- torch.__future__.get_swap_module_params_on_conversion() answers True inside
  such a conversion on its thread (what Module._apply reads), else PyTorch's
  own setting (False unless the user set it).

A tensor that cannot be swapped (a parameter with a weak reference to it,
e.g. from torch.compile's guards, or one an autograd graph still holds)
makes that conversion use PyTorch's default, and the parameters that were
one object before are made one again afterwards (ties kept, but new
Parameter objects for those that moved).
"""
import collections
import functools
import threading
import weakref

import torch

_tls = threading.local()
_installed = False


def _depth():
    return getattr(_tls, "depth", 0)


def _swap_active():
    return getattr(_tls, "swap", False)


def _involves_tpu_target(device):
    try:
        return device is not None and torch.device(device).type == "tpu"
    except (RuntimeError, TypeError):
        return False


def _tensors(module):
    for p in module.parameters():
        yield p
        if p.grad is not None:
            yield p.grad
    yield from module.buffers()


def _holds_tpu(module):
    return any(t.device.type == "tpu" for t in _tensors(module))


def _holds_meta(module):
    # What `param.data = converted` cannot take from (new Parameters otherwise).
    return any(t.device.type == "meta" for t in _tensors(module))


def _swappable(module):
    # RNN modules keep weak references to their own weights and drop them
    # before their parameters are converted (RNNBase._apply): those are fine.
    own = collections.Counter()
    for m in module.modules():
        if isinstance(m, torch.nn.RNNBase):
            for r in getattr(m, "_flat_weight_refs", ()):
                w = r() if r is not None else None
                if w is not None:
                    own[id(w)] += 1
    return all(weakref.getweakrefcount(p) <= own[id(p)] for p in module.parameters())


def _parameter_slots(module):
    """(module, name, parameter) for every parameter slot, tied ones repeated."""
    return [(m, name, p) for m in module.modules() for name, p in m._parameters.items() if p is not None]


def _retie(slots):
    first = {}
    for m, name, old in slots:
        if id(old) in first:
            m._parameters[name] = first[id(old)]
        else:
            first[id(old)] = m._parameters[name]


def _lazy_slots(module):
    """(module, slot dict, name, requires_grad, class) of every lazy module's
    uninitialized parameter or buffer (LazyLinear, LazyConv2d before their
    first forward)."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
    out = []
    for m in module.modules():
        for slots in (m._parameters, m._buffers):
            for name, t in slots.items():
                if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
                    out.append((m, slots, name, t.requires_grad, type(t)))
    return out


def _keep_lazy(lazy):
    # A swap (or PyTorch's new-Parameter path) turns an uninitialized
    # parameter into an empty plain one, which the lazy module then takes for
    # its weight: put an uninitialized one back, on the converted device and dtype.
    for m, slots, name, requires_grad, cls in lazy:
        t = slots.get(name)
        if t is not None and not isinstance(t, cls):
            slots[name] = cls(requires_grad=requires_grad, device=t.device, dtype=t.dtype)


def _wrap_apply(orig):
    @functools.wraps(orig)
    def _apply(self, fn, recurse=True):
        if _depth() > 0:  # inside a conversion already decided at its top
            return orig(self, fn, recurse)
        target = getattr(_tls, "target_tpu", False)
        involves = target or _holds_tpu(self)
        swap = involves and _holds_meta(self) and _swappable(self)
        slots = _parameter_slots(self) if involves else None
        lazy = _lazy_slots(self) if involves else ()
        _tls.depth = 1
        _tls.swap = swap
        try:
            try:
                out = orig(self, fn, recurse)
            except RuntimeError as err:
                # swap_tensors refuses a tensor used elsewhere (e.g. saved by
                # autograd for a backward still pending): convert the rest the
                # default way (new Parameters; the swapped ones stay as they
                # are, fn is a no-op on them) and re-tie below.
                if not swap or "Couldn't swap" not in str(err):
                    raise
                _tls.swap = False
                out = orig(self, fn, recurse)
        finally:
            _tls.depth = 0
            _tls.swap = False
        if slots is not None:
            _retie(slots)
        _keep_lazy(lazy)
        return out
    return _apply


def _targeting(method, device_of):
    """Wraps a Module method so that its conversion knows it goes to tpu."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if _depth() > 0 or getattr(_tls, "target_tpu", False) or not _involves_tpu_target(device_of(*args, **kwargs)):
            return method(self, *args, **kwargs)
        _tls.target_tpu = True
        try:
            return method(self, *args, **kwargs)
        finally:
            _tls.target_tpu = False
    return wrapper


def _to_device(*args, **kwargs):
    try:
        return torch._C._nn._parse_to(*args, **kwargs)[0]
    except Exception:  # PyTorch's own call raises the error
        return None


def _to_empty_device(*args, device=None, **kwargs):
    return args[0] if args else device


def _tpu_device(device=None):
    return "tpu"


def install():
    """Once, after torch.utils.generate_methods_for_privateuse1_backend (Module.tpu)."""
    global _installed
    if _installed:
        return
    _installed = True
    orig_get = torch.__future__.get_swap_module_params_on_conversion

    @functools.wraps(orig_get)
    def get_swap_module_params_on_conversion():
        return orig_get() or _swap_active()

    torch.__future__.get_swap_module_params_on_conversion = get_swap_module_params_on_conversion
    M = torch.nn.Module
    M._apply = _wrap_apply(M._apply)
    M.to = _targeting(M.to, _to_device)
    M.to_empty = _targeting(M.to_empty, _to_empty_device)
    if hasattr(M, "tpu"):
        M.tpu = _targeting(M.tpu, _tpu_device)
