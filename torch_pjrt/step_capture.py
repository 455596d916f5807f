"""Step capture: run a whole training (or inference) step as one XLA program
without running its Python on every call.

    step = torch_pjrt.capture_step(train_step)   # or @torch_pjrt.capture_step
    for x, y in batches:                          # tpu tensors of one shape
        loss = step(x, y)

The first call runs the step under fused eager (a warm-up: lazy state such as
an optimizer's moments is created). The next two calls run it again under
fused eager and record its trace; once two consecutive recordings agree (the same ops,
reading the same tensors, with the same host scalars, view offsets and host
uploads), later calls replay the trace's fused program: the step's Python,
autograd and optimizer code do not run, arguments are read from the tensors
passed, weights and optimizer state are read and updated in place (their
buffers donated), random ops draw new keys from the default generator, and
each tensor the step returned comes back as a new tensor. If three recordings
in a row cannot be replayed or disagree with the one before, the step is not
replayed: it runs under fused eager on every call (always correct) and a
warning says why once.

What is replayed is what the step did on tpu tensors; as with CUDA graphs,
Python side effects are not repeated. The step must read its inputs from its
tpu tensor arguments or from tensors it updates in place, and host numbers
that change between calls make a step unreplayable. What a recording can
see is checked: a host read of a tpu value (``.item()``, ``int(t)``,
``.tolist()``), an in-place write to a CPU tensor that outlives the step (an
optimizer's step count on the CPU: use ``capturable=True``) or an LR
scheduler stepped inside the step make it unreplayable; a changed optimizer
hyperparameter (a schedule stepped outside the step) makes the next call
record it again, and so does a tensor the step took with grad mode on (or
passed to a compiled piece) frozen or unfrozen since (``p.requires_grad_(False)``:
autograd then computes other grads, and the optimizer steps other
parameters). Other Python numbers the step reads are baked in. A replay sets
the ``.grad`` of its leaf arguments that require grad as the step's backward
did (a new tensor, or added to the one the argument had; whether it had one
is part of the signature). Grad mode, autocast and its dtype, the default
dtype and the float32 matmul precision are part of the signature too, and
so is the train/eval mode of the modules the step reaches by name (its
globals, closure cells, bound object, and those objects' attributes) whose
code reads ``training``: after ``model.eval()`` the step is recorded in eval
mode, and back in training mode the training recording replays. A step
that returns a tensor carrying an autograd graph no backward in it went
through (a forward with grad enabled) is not replayed: a replay cannot build
the graph its caller may backpropagate through. After
replacing a model's or optimizer's tensors (a new optimizer, ``model.to()``),
or changing the mode of a module the step reaches otherwise, call
``step.reset()`` (state that was replaced and freed
is noticed anyway: the call records the step again). Each argument geometry (shapes,
strides, dtypes) and each set of non-tensor arguments is recorded
separately. See docs/ARCHITECTURE.md, "Step capture"."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import types
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _state
from ._capture_watch import Watch, unchanged

__all__ = ["capture_step", "CapturedStep"]

_recording = [0]  # steps being recorded now (a captured step called inside one runs inline)
_noting = [None]  # the _Signature whose programs are being noted for its manifest (one at a time)
_MANIFEST_DIR = "capture"  # under the persistent cache's directory
_MAX_SIGNATURES = 256  # kept per step; the least recently used half goes beyond
_MAX_FAILURES = 3  # recordings in a row that cannot be replayed (or disagree) before giving up


class _fused:
    """A fused eager region (torch_pjrt.fused, without importing the package)."""

    def __enter__(self):
        _state.C.fused_enter()

    def __exit__(self, *exc):
        _state.C.fused_leave()
        return False


class _Signature:
    """What one argument signature has seen: calls, the last recording, and
    then the replayable recording (or why there is none)."""

    __slots__ = ("calls", "used", "last", "recording", "problem", "out_spec", "out_leaves", "tensor_at", "failures",
                 "manifest", "optimizers", "grads", "last_grads")
    # out_spec None with a recording: the step returns a single tensor.

    def __init__(self):
        self.calls = 0
        self.used = 0  # the call that used it last (CapturedStep._tick)
        self.last = None
        self.recording = None
        self.problem = None
        self.out_spec = None
        self.out_leaves = None
        self.tensor_at = None
        self.failures = 0
        self.manifest = None  # where this signature's program keys are saved (None: no cache)
        self.optimizers = ()  # what the replayed recording's optimizers' hyperparameters were
        self.grads = None  # the replayed recording's argument grads (_arg_grads), None: no argument requires grad
        self.last_grads = None  # the same for `last`


class CapturedStep:
    """A step function recorded once and replayed as one program; see the
    module's docstring."""

    def __init__(self, fn, *, warmup: int = 1):
        if not callable(fn):
            raise TypeError(f"capture_step: expected a callable, got {type(fn).__name__}")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"capture_step: warmup must be an int >= 0, got {warmup!r}")
        self.fn = fn
        self.warmup = warmup
        self._signatures: dict = {}
        self._tick = 0  # calls, for the signatures' last use
        self._warned: set = set()  # reasons already warned about
        self._modules = None  # the modules the step reaches by name (_modules_of), found at the first call
        functools.update_wrapper(self, fn)

    def reset(self):
        """Forgets every recording: the next calls warm up and record again
        (after the model's or optimizer's tensors were replaced)."""
        self._signatures.clear()
        self._modules = None

    def replayable(self, *args, **kwargs):
        """Whether a call with these arguments replays a recording (None while
        still warming up or recording), and the reason when it cannot."""
        key, _ = self._key(args, kwargs)
        sig = self._signatures.get(key)
        if sig is None or (sig.recording is None and sig.problem is None):
            return None, None
        return sig.recording is not None, sig.problem

    def _key(self, args, kwargs):
        modules = self._modules
        if modules is None:
            modules = self._modules = _modules_of(self.fn)
        # Their train/eval flags: dropout and batch norm record other ops in eval mode.
        training = tuple([m.training for m in modules])
        if not kwargs:  # the common case, without flattening: positional tpu tensors
            key = [len(args), training, *_modes()]
            for a in args:
                if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
                    break
                key.append((a.device.index, a.dtype, a.shape, a.stride(), a.storage_offset(),
                            a.requires_grad and _grad_key(a)))
            else:
                return tuple(key), list(args)
        leaves, spec = tree_flatten((args, kwargs))
        key = [spec, training, *_modes()]
        tensors = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                if leaf.device.type != "tpu":
                    return None, f"argument {i} is a {leaf.device.type} tensor (replay reads tpu tensors only)"
                key.append((leaf.device.index, leaf.dtype, tuple(leaf.shape), leaf.stride(),
                            leaf.storage_offset(), leaf.requires_grad and _grad_key(leaf)))
                tensors.append(leaf)
            elif isinstance(leaf, torch.nn.Module):  # a model passed in: by identity and mode
                key.append((leaf, tuple([m.training for m in leaf.modules() if _reads_training(type(m))])))
            else:
                key.append((type(leaf), leaf))
        key = tuple(key)
        try:
            hash(key)
        except TypeError:
            return None, "an argument is neither a tensor nor hashable"
        return key, tensors

    def __call__(self, *args, **kwargs):
        if _recording[0]:  # called inside a step being recorded: part of that step
            return self.fn(*args, **kwargs)
        key, tensors = self._key(args, kwargs)
        if key is None:  # tensors holds why
            self._warn_once(tensors, stacklevel=3)
            with _fused():
                return self.fn(*args, **kwargs)
        sig = self._signatures.get(key)
        if sig is None:
            if len(self._signatures) >= _MAX_SIGNATURES:
                self._forget_least_used()
            sig = self._signatures[key] = _Signature()
            self._warm_start(sig, key)
        self._tick += 1
        sig.used = self._tick
        if sig.recording is not None and sig.optimizers and not unchanged(sig.optimizers):
            sig.recording = sig.last = None  # e.g. a new learning rate: record the step again
        if sig.recording is not None:
            grads = sig.grads
            if grads is None:
                outs = _state.C.capture_replay(sig.recording, tensors)
            else:  # the grads autograd adds to are read and written like arguments
                grad_inputs = [tensors[i].grad for i in grads[0]]
                outs = _state.C.capture_replay(sig.recording, list(tensors) + grad_inputs)
            if outs is None and _state.C.capture_recording_stale(sig.recording):
                # State it reads or writes is held by nothing else now (a grad
                # another step set to None), or a tensor it took was frozen or
                # unfrozen since: record the step again.
                sig.recording = sig.last = None
            elif outs is None:  # arguments that alias each other or the step's state differently
                with _fused():
                    return self.fn(*args, **kwargs)
        if sig.recording is not None:
            if grads is not None:
                for i, k in grads[1]:  # as the step's backward set them
                    tensors[i].grad = None if k < 0 else outs[k]
            if sig.out_spec is None:  # the step returned one tensor
                return outs[0]
            leaves = list(sig.out_leaves)
            for at, t in zip(sig.tensor_at, outs):
                leaves[at] = t
            if grads is not None:
                for at, j in grads[2]:  # an argument's grad the step added to, returned
                    leaves[at] = grad_inputs[j]
            return tree_unflatten(leaves, sig.out_spec)
        sig.calls += 1
        if sig.problem is not None or sig.calls <= self.warmup:
            with _fused():
                return self.fn(*args, **kwargs)
        return self._record(sig, args, kwargs, tensors)

    def _record(self, sig, args, kwargs, tensors):
        # Leaf arguments that require grad: a backward in the step sets or adds to their .grad.
        grad_args = [i for i, a in enumerate(tensors) if a.requires_grad and a.is_leaf]
        grads_before = [tensors[i].grad for i in grad_args]
        # Autocast's cache of weight casts outlives the step when an autocast
        # region encloses the call: a recording would read a cast the region's
        # exit frees, and never replay. Recorded without it, each cast is in
        # the step's program. (Only then: Dynamo guards on the setting, and a
        # compiled piece in the step would be compiled again.)
        cache = torch.is_autocast_cache_enabled()
        outer_autocast = cache and torch.is_autocast_enabled("tpu")
        with _fused():
            _state.C.capture_begin()
            _recording[0] += 1
            if outer_autocast:
                torch.set_autocast_cache_enabled(False)
            try:
                with Watch() as watch:
                    out = self.fn(*args, **kwargs)
            except BaseException:
                _state.C.capture_abort()
                raise
            finally:
                if outer_autocast:
                    torch.set_autocast_cache_enabled(True)
                _recording[0] -= 1
            leaves, spec = tree_flatten(out)
            tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
            grads, grad_inputs, new_grads = None, [], []
            if grad_args:
                grads, grad_inputs, new_grads = _arg_grads(tensors, grad_args, grads_before, leaves, tensor_at)
                returned_grads = {at for at, _ in grads[2]}
                tensor_at = [at for at in tensor_at if at not in returned_grads]
            recording = _state.C.capture_end(list(tensors) + grad_inputs, [leaves[i] for i in tensor_at] + new_grads)
        own = _state.C.capture_recording_problem(recording) or watch.problem or _graph_outlives(leaves, tensor_at)
        problem = own or (_state.C.capture_problem(sig.last, recording) if sig.last is not None else "")
        if not problem and sig.last is not None and grads != sig.last_grads:
            problem = "two calls set the .grad of their arguments differently"
        if problem:
            # The first recordings may differ for a reason that goes away (state created
            # lazily, a one-off host read): give up after _MAX_FAILURES in a row.
            sig.failures += 1
            if sig.failures >= _MAX_FAILURES:
                sig.problem = problem
                _finish_noting(sig, save=False)
                _state.C.capture_count_not_replayable()
                self._warn_once(problem, stacklevel=4)
        elif sig.last is not None:
            sig.failures = 0
            sig.recording = recording
            _finish_noting(sig, save=True)
            sig.out_spec = None if isinstance(out, torch.Tensor) and len(tensor_at) == 1 else spec
            sig.out_leaves = [None if isinstance(v, torch.Tensor) else v for v in leaves]
            sig.tensor_at = tensor_at
            sig.optimizers = watch.optimizers
            sig.grads = grads
        sig.last = None if own else recording
        sig.last_grads = grads
        return out

    def _warm_start(self, sig, key):
        """A new signature: load the programs an earlier process saved for it in
        the background (its manifest), and note this one's for the next."""
        # (imported here: `python -m torch_pjrt.cache` must not find it imported by the package)
        from .cache import cache_dir
        directory = cache_dir()
        if not directory:
            return
        # (the runtime's cache identity too: a process with other XLA_FLAGS
        # or another plugin writes other entries, so it keeps its own list)
        ident = repr((getattr(self.fn, "__module__", None), getattr(self.fn, "__qualname__", None), key,
                      _state.C.cache_identity()))
        sig.manifest = os.path.join(directory, _MANIFEST_DIR, hashlib.sha256(ident.encode()).hexdigest() + ".json")
        try:
            with open(sig.manifest) as f:
                programs = [(str(k), int(n)) for k, n in json.load(f)["programs"]]
        except (OSError, ValueError, KeyError, TypeError):
            programs = None  # none saved yet, or unreadable: recorded and saved anew
        if programs:
            _state.C.capture_prefetch(programs)
        if _noting[0] is None:
            _noting[0] = sig
            _state.C.capture_note_programs(True)

    def _forget_least_used(self):
        """Bounds the signatures kept (a number that changes every call, passed
        as a Python number, makes a new one each call): the least recently
        used half goes, with a warning the first time."""
        by_use = sorted(self._signatures.items(), key=lambda kv: kv[1].used)
        for key, _ in by_use[:len(by_use) // 2]:
            del self._signatures[key]
        if "too many signatures" not in self._warned:
            self._warned.add("too many signatures")
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            warnings.warn(f"torch_pjrt.capture_step({name}): called with more than {_MAX_SIGNATURES} different "
                          "argument signatures (shapes, dtypes or non-tensor argument values; each is warmed up "
                          "and recorded on its own), the least recently used are forgotten: pass a number that "
                          "changes every call as a tpu tensor", RuntimeWarning, stacklevel=3)

    def _warn_once(self, why, stacklevel):
        """Warns (once per reason) at the line that called the step."""
        if why in self._warned:
            return
        self._warned.add(why)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        warnings.warn(f"torch_pjrt.capture_step({name}): not replayed, running it under fused eager on every "
                      f"call instead: {why}", RuntimeWarning, stacklevel=stacklevel)


def _graph_outlives(leaves, tensor_at):
    """Why a recording cannot be replayed when a tensor the step returns
    carries an autograd graph that no backward in the step went through ('' if
    none): the caller may still backpropagate through it, and a replay neither
    rebuilds the graph nor may overwrite the values it saved. A node whose
    saved tensors were freed was gone through; where no node tells, the graph
    counts as live."""
    pending = [leaves[i].grad_fn for i in tensor_at if leaves[i].grad_fn is not None]
    if not pending:
        return ""
    seen, freed = set(), False
    while pending and len(seen) < 100_000:  # (bounded: past that, the nodes seen decide)
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        state = None
        for name in [a for a in dir(node) if a.startswith("_saved_")] + ["saved_tensors"]:
            try:
                value = getattr(node, name)
            except AttributeError:
                continue
            except RuntimeError:  # "Trying to backward through the graph a second time ..."
                state = "freed"
                break
            if isinstance(value, torch.Tensor) or (
                    isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)):
                state = "live"
                break
        if state == "live":
            break
        if state == "freed":
            freed = True
            continue
        pending.extend(f for f, _ in node.next_functions)
    else:
        if freed:
            return ""
    return ("it returns a tensor whose autograd graph no backward in the step went through (a replay cannot "
            "rebuild it): call backward inside the step, or return .detach() or run it under torch.no_grad()")


def _modes():
    """The global settings that change what a step's ops compute or make: a
    recording under one is not replayed under another (autocast to another
    dtype, another default dtype for factories, another float32 matmul
    precision, which the step's dots carry)."""
    autocast = torch.is_autocast_enabled("tpu")
    return (torch.is_grad_enabled(), autocast and torch.get_autocast_dtype("tpu"), torch.get_default_dtype(),
            torch.get_float32_matmul_precision())


def _modules_of(fn, depth=3):
    """The nn.Modules (with their submodules) a step function reaches by name:
    the globals its code names, its closure cells, a bound method's object, a
    partial's arguments, the attributes of plain objects among those (a
    trainer's model), and the same for the functions among them. A heuristic:
    a module reached otherwise is not seen (step.reset() after its mode
    changes)."""
    found, seen = {}, set()

    def visit(obj, depth):
        if id(obj) in seen or depth < 0:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                found.setdefault(id(m), m)
        elif isinstance(obj, functools.partial):
            for o in (obj.func, *obj.args, *obj.keywords.values()):
                visit(o, depth)
        elif hasattr(obj, "__func__") and hasattr(obj, "__self__"):  # a bound method
            visit(obj.__self__, depth)
            visit(obj.__func__, depth)
        elif hasattr(obj, "__code__"):  # a Python function
            names, stack = set(), [obj.__code__]
            while stack:  # its code and the code of the functions it defines
                code = stack.pop()
                names.update(code.co_names)
                stack.extend(c for c in code.co_consts if hasattr(c, "co_names"))
            glob = getattr(obj, "__globals__", {})
            for name in names:
                if name in glob:
                    visit(glob[name], depth - 1)
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth - 1)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(obj, (list, tuple)):
            for o in obj[:64]:
                visit(o, depth - 1)
        elif isinstance(obj, dict):
            for o in list(obj.values())[:64]:
                visit(o, depth - 1)
        elif not isinstance(obj, (type, types.ModuleType, torch.Tensor)) and hasattr(obj, "__dict__"):
            for o in list(vars(obj).values())[:64]:  # a trainer's or wrapper's attributes
                visit(o, depth - 1)

    try:
        visit(fn, depth)
    except Exception:  # noqa: BLE001 - an object whose attributes cannot be read: keep what was found
        pass
    return [m for m in found.values() if _reads_training(type(m))]


@functools.lru_cache(maxsize=None)
def _reads_training(cls):
    """Whether a module class's own code (its methods and the functions they
    define, nn.Module's excepted) names `training`: only those modules'
    flags are keyed, a few of a model's many."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            continue
        for value in vars(klass).values():
            stack = [getattr(getattr(value, "__func__", value), "__code__", None)]
            while stack:
                code = stack.pop()
                if code is None:
                    continue
                if "training" in code.co_names:
                    return True
                stack.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return False


def _grad_key(a):
    """What a tensor argument that requires grad adds to its signature: whether
    it is a leaf, and the layout of its .grad (which a backward in the step
    adds to in place) or that it has none (the backward sets a new one)."""
    if not a.is_leaf:
        return "non-leaf"
    g = a.grad
    return "no grad" if g is None else (g.dtype, g.stride(), g.storage_offset())


def _arg_grads(tensors, grad_args, grads_before, leaves, tensor_at):
    """What a recording did to the .grad of its leaf arguments that require
    grad (`grad_args`, their grads before the call `grads_before`), as
    ((arguments whose grad a replay reads and writes in place, passed after
    the arguments), ((argument, output a replay sets as its grad, or -1 for
    None), ...), ((returned leaf, index into the first) for a returned grad
    of the first kind)); then those grads, and the new grads to pass as
    returned after the step's returned tensors."""
    read = tuple(i for i, g in zip(grad_args, grads_before) if g is not None)
    inputs = [g for g in grads_before if g is not None]
    returned = tuple((at, j) for at in tensor_at for j, g in enumerate(inputs) if leaves[at] is g)
    kept = [at for at in tensor_at if all(at != r for r, _ in returned)]
    new, set_ = [], []
    for i, before in zip(grad_args, grads_before):
        after = tensors[i].grad
        if after is before:
            continue  # untouched, or added to in place
        k = -1
        if after is not None:
            k = next((n for n, at in enumerate(kept) if leaves[at] is after), None)
            if k is None:
                k = len(kept) + len(new)
                new.append(after)
        set_.append((i, k))
    return (read, tuple(set_), returned), inputs, new


def _finish_noting(sig, save):
    """The signature's recordings are done: save the programs it used (when
    it replays), stop loading ahead."""
    _state.C.capture_prefetch_stop()
    if _noting[0] is not sig:
        return
    _noting[0] = None
    programs = _state.C.capture_noted_programs()
    _state.C.capture_note_programs(False)
    if not (save and programs and sig.manifest):
        return
    try:  # written whole, then renamed: a concurrent reader sees the old file or the new one
        os.makedirs(os.path.dirname(sig.manifest), exist_ok=True)
        tmp = f"{sig.manifest}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"programs": [list(p) for p in programs]}, f)
        os.replace(tmp, sig.manifest)
    except OSError:
        pass  # a read-only cache directory: no warm-start help, nothing else changes


@atexit.register
def _stop_prefetch():
    # The background loads run in the plugin: they end before the interpreter does.
    try:
        _state.C.capture_prefetch_stop()
    except Exception:  # noqa: BLE001 - the runtime may be gone already
        pass


def capture_step(fn=None, *, warmup: int = 1):
    """Wraps a step function so that, once recorded, it runs as one replayed
    XLA program (see the module's docstring). Usable as a decorator, with or
    without arguments."""
    if fn is None:
        return functools.partial(capture_step, warmup=warmup)
    return CapturedStep(fn, warmup=warmup)
