"""The readiness check: capture the programs torch.compile(backend="tpu")
makes for one step of a model (inference, or forward + backward + optimizer
step), without running them; compile each for a TPU topology with libtpu;
report per program and per step the peak memory per chip against the chip's
memory, flops, bytes accessed, arithmetic intensity and a roofline time
estimate; search the largest batch that fits by compiling."""
import copy
import dataclasses
import logging
import math
import os
import re
import time
from typing import Any, Dict, List, Optional

import torch

from .._compile import capture as capture_mod
from .._compile.lower_graph import Unsupported
from ..assess.workload import call as _call  # model(*inputs) / model(**inputs) / model(inputs)
from . import hlo, plugin, roofline, sharding

MARGIN_NOTE = "peak bytes per chip from XLA's compiled memory statistics; time is a roofline ESTIMATE"


@dataclasses.dataclass
class ProgramFigures:
    name: str
    phase: str
    peak_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    flops: float
    bytes_accessed: float
    transcendentals: float
    arithmetic_intensity: Optional[float]
    estimate_seconds: Optional[float]
    bound: Optional[str]
    compile_seconds: float
    resident_other_bytes: int  # the step's persistent tensors this program does not take (they stay in memory)
    hlo_text: Optional[str] = None
    serialized_path: Optional[str] = None
    error: Optional[str] = None  # set when libtpu refused it (out of memory): no cost figures then


@dataclasses.dataclass
class Report:
    """One model, one batch, one topology (and chip count)."""
    topology: str
    generation: Optional[str]
    device_kind: str
    devices_in_topology: int
    devices_per_chip: int  # libtpu shows each TensorCore as a device on v4 and tpu7x: figures are per device
    chips: int
    memory_per_chip: int
    mode: str
    batch_size: Optional[int]
    programs: List[ProgramFigures]
    step_peak_bytes: int
    fits: bool
    margin_bytes: int
    step_flops: float
    step_bytes_accessed: float
    step_estimate_seconds: Optional[float]
    peak_flops_per_device: Optional[float]
    bandwidth_per_device: Optional[float]
    note: str = MARGIN_NOTE
    largest_batch: Optional[int] = None        # searched by compiling (find_largest_batch)
    smallest_not_fitting: Optional[int] = None  # the search's bound: a batch compiled and found too big

    def to_dict(self):
        d = dataclasses.asdict(self)
        for p in d["programs"]:
            p.pop("hlo_text", None)  # large; kept on the object (and saved files)
        d["estimate"] = "roofline estimate from published peaks, not a measurement"
        return d

    def largest_text(self):
        """The searched largest batch as the CLI's table shows it: "L",
        "L (<N)" (stopped within the tolerance), ">= L" (L fits and no larger
        batch was found too big: the search hit max_batch), "none" (not even
        `chips` fits), or "" when no search ran."""
        lo, hi = self.largest_batch, self.smallest_not_fitting
        if lo is None:
            return "none" if hi else ""
        if hi is None:
            return f">= {lo}"
        return str(lo) if hi - lo <= self.chips else f"{lo} (<{hi})"

    def summary(self):
        from .cli import _bytes, _seconds
        fits = "fits" if self.fits else "does NOT fit"
        est = f"{_seconds(self.step_estimate_seconds)} (estimate)" if self.step_estimate_seconds else "n/a"
        largest = f", largest batch {self.largest_text()}" if self.largest_text() else ""
        return (f"{self.topology} x{self.chips} chip(s), batch {self.batch_size}: {fits} "
                f"(peak {_bytes(self.step_peak_bytes)} of {_bytes(self.memory_per_chip)} per chip, "
                f"margin {_bytes(self.margin_bytes)}), {self.step_flops / 1e9:.3g} GFLOP per step per chip, "
                f"step {est}{largest}")


# ---- capture ------------------------------------------------------------------------------

def _placeholder(x):
    """A never-written tpu tensor like `x` (no memory, no copy)."""
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="tpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_placeholder(e) for e in x)
    if isinstance(x, dict):
        return {k: _placeholder(v) for k, v in x.items()}
    return x


def _on_tpu_model(model):
    """A tpu copy of the model whose storages are never written: a factory
    is built on the meta device; a module is copied with meta stand-ins for
    its parameters and buffers (no weights copied; tied ones stay tied)."""
    if isinstance(model, torch.nn.Module):
        memo = {}
        for t in list(model.parameters()) + list(model.buffers()):
            meta = torch.empty_like(t, device="meta")
            memo[id(t)] = torch.nn.Parameter(meta, t.requires_grad) if isinstance(t, torch.nn.Parameter) else meta
        m = copy.deepcopy(model, memo)
    else:
        with torch.device("meta"):
            m = model()
    return m.to_empty(device="tpu")


def optimizer_factory(optimizer):
    """`optimizer` as a function of parameters: an optimizer instance (built
    for the user's own model) gives one of its type with its settings."""
    if isinstance(optimizer, torch.optim.Optimizer):
        kind, defaults = type(optimizer), dict(optimizer.defaults)
        return lambda params: kind(params, **defaults)
    return optimizer


def _default_loss(out):
    t = out if isinstance(out, torch.Tensor) else torch.utils._pytree.tree_leaves(out)[0]
    return t if t.dim() == 0 else t.float().mean()


def capture_step(model, inputs, mode="inference", optimizer=None, loss_fn=None):
    """(programs, persistent storages {key: nbytes}) of one step."""
    import torch._dynamo
    torch._dynamo.reset()  # a fresh trace per batch size: no recompile limits, no stale graphs
    tpu_model = _on_tpu_model(model) if isinstance(model, torch.nn.Module) or mode == "training" \
        else model
    if mode == "training":
        tpu_model.train()
    elif isinstance(tpu_model, torch.nn.Module):
        tpu_model.eval()
    persistent = {}

    def remember(t):
        if isinstance(t, torch.Tensor) and t.device.type == "tpu":
            persistent[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    if isinstance(tpu_model, torch.nn.Module):
        for t in list(tpu_model.parameters()) + list(tpu_model.buffers()):
            remember(t)
    # Placeholders take no memory, so the host's size must not bound them:
    # lift the limit while capturing (a TPU's memory is judged by libtpu).
    import torch_pjrt
    limits = [torch_pjrt.memory_limit(d) for d in range(torch.tpu.device_count())]
    torch_pjrt.set_memory_limit(1 << 62)
    # Dynamo says once that it ignores the optimizer's profiler scope: not the user's concern here.
    quiet = logging.getLogger("torch._dynamo.variables.ctx_manager")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with capture_mod.capture() as cap:
            _run_step(cap, tpu_model, _placeholder(inputs), mode, optimizer, loss_fn, remember)
    except Unsupported as e:
        raise RuntimeError(f"torch_pjrt: readiness: the step cannot be one TPU program: {e} (without a "
                           "lowering it would run on the host between programs; docs/supported_ops.md)") from e
    finally:
        quiet.setLevel(level)
        for d, limit in enumerate(limits):
            torch_pjrt.set_memory_limit(limit, device=d)
    torch._dynamo.reset()
    return cap.programs, persistent


def _run_step(cap, tpu_model, inputs, mode, optimizer, loss_fn, remember):
    """One step under capture, each part labelled with its phase."""
    if mode != "training":
        fn = torch.compile(tpu_model, backend="tpu", dynamic=False)
        cap.phase = "forward"
        with torch.no_grad():
            _call(fn, inputs)
        return
    opt = (optimizer or (lambda ps: torch.optim.SGD(ps, lr=1e-2)))(tpu_model.parameters())
    lf = loss_fn or (lambda out, _inputs: _default_loss(out))
    # Model and loss in one compiled function: no eager op touches the placeholders.
    fwd = torch.compile(lambda *a, **k: lf(_call(tpu_model, a if a else k), inputs), backend="tpu", dynamic=False)
    step = torch.compile(opt.step, backend="tpu", dynamic=False)
    cap.phase = "forward"
    loss = _call(fwd, inputs)
    cap.phase = "backward"
    loss.backward()
    for p in tpu_model.parameters():
        remember(p.grad)
    cap.phase = "optimizer step"
    step()
    for state in opt.state.values():
        for v in state.values():
            remember(v)


# ---- compile for a topology -----------------------------------------------------------------

def _topology_facts(topo):
    info = topo.info()
    devices = info["devices"]
    kind = devices[0]["kind"] if devices else "?"
    memory = int(info["attributes"].get("device_memory_bytes_limit", 0) or 0)
    cores = max([int(d["attributes"].get("core_on_chip", 0) or 0) for d in devices] + [0]) + 1
    return kind, len(devices), memory, cores


def chip_memory(topology):
    """Memory per chip of a topology, from its attributes."""
    return _topology_facts(plugin.topology(topology))[2]


def _splits(program, chips, persistent):
    """Per program parameter: split its elements over the chips (a data input) or not."""
    types = sharding.param_types(program.text)
    out = []
    for (kind, index), ty in zip(program.params, types):
        if chips == 1 or kind != "input" or index < 0 or program.inputs[index] is None:
            out.append(False)
            continue
        shape, _, key = program.inputs[index]
        out.append(key is not None and key not in persistent and bool(shape)
                   and shape[0] % chips == 0 and sharding.split_arg(sharding.numel_of(ty), chips))
    return out


def compile_programs(programs, persistent, topology="v5e:2x2", chips=1, save_dir=None, keep_hlo=True):
    """ProgramFigures per captured program, compiled for `topology` over `chips` devices."""
    topo = plugin.topology(topology)
    kind, n_devices, memory, cores = _topology_facts(topo)
    if chips < 1 or chips > n_devices:
        raise ValueError(f"torch_pjrt: readiness: {chips} chips asked, topology {topology} has {n_devices} devices")
    peak = roofline.peaks(kind, cores)
    figures = []
    for prog in programs:
        text = prog.text
        if chips > 1:
            text = sharding.annotate(text, _splits(prog, chips, persistent), chips)
        taken = {i[2] for i in prog.inputs if i is not None}
        resident = sum(b for k, b in persistent.items() if k not in taken)
        t0 = time.perf_counter()
        try:
            r = plugin.plugin().compile(topo, text, 1, chips, chips > 1)
        except RuntimeError as e:
            required = out_of_memory_bytes(str(e))
            if required is None:
                raise
            # libtpu refuses to compile a program whose buffers exceed the
            # chip's memory: that program (so the step) does not fit.
            figures.append(ProgramFigures(
                name=prog.name, phase=prog.phase, peak_bytes=max(required, memory + 1), argument_bytes=0,
                output_bytes=0, alias_bytes=0, temp_bytes=0, code_bytes=0, flops=0.0, bytes_accessed=0.0,
                transcendentals=0.0, arithmetic_intensity=None, estimate_seconds=None, bound=None,
                compile_seconds=time.perf_counter() - t0, resident_other_bytes=resident,
                error="out of memory at compile: " + str(e).split("': ", 1)[-1][:300]))
            continue
        m, c = r["memory"], r["cost"]
        flops, nbytes = c.get("flops", 0.0), c.get("bytes accessed", 0.0)
        est, bound = roofline.estimate(flops, nbytes, *peak) if peak else (None, None)
        path = None
        if save_dir:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, f"{prog.name}.{topology.replace(':', '_')}.x{chips}.pjrtexe")
            with open(path, "wb") as f:
                f.write(r["serialized"])
        text_out = hlo.to_text(r["optimized_program"], r["optimized_format"]) if keep_hlo or save_dir else None
        if save_dir and text_out:
            with open(path[:-len(".pjrtexe")] + ".hlo.txt", "w") as f:
                f.write(text_out)
        figures.append(ProgramFigures(
            name=prog.name, phase=prog.phase, peak_bytes=int(m.get("peak_bytes", 0)),
            argument_bytes=int(m.get("argument_bytes", 0)), output_bytes=int(m.get("output_bytes", 0)),
            alias_bytes=int(m.get("alias_bytes", 0)), temp_bytes=int(m.get("temp_bytes", 0)),
            code_bytes=int(m.get("generated_code_bytes", 0)),
            flops=flops, bytes_accessed=nbytes, transcendentals=c.get("transcendentals", 0.0),
            arithmetic_intensity=flops / nbytes if nbytes else None, estimate_seconds=est, bound=bound,
            compile_seconds=r["seconds"], resident_other_bytes=resident, hlo_text=text_out, serialized_path=path))
    return figures, (kind, n_devices, memory, peak, cores)


_SIZE = re.compile(r"required for [^(]*\(([0-9.]+)([KMGT]?)\)")


def out_of_memory_bytes(message):
    """The bytes libtpu's "Ran out of memory ... required for HLO temporaries
    (15.75G) exceeds available HBM" names (summed over the parts it lists),
    or None when the message is not an out-of-memory refusal."""
    if "Ran out of memory" not in message and "RESOURCE_EXHAUSTED" not in message:
        return None
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(sum(float(v) * scale[u] for v, u in _SIZE.findall(message)))


def check_batch_splits(batch_size, chips):
    """Data parallel splits the batch over the chips: a batch that does not
    divide would be replicated (every chip the whole batch), which is not
    what `chips` promises, so it is refused rather than reported as a split."""
    if chips > 1 and batch_size is not None and batch_size % chips:
        raise ValueError(f"torch_pjrt: readiness: batch {batch_size} does not split over {chips} chips "
                         f"(data parallel: the batch must be a multiple of chips)")


def validate_args(model_or_fn, topology, chips, max_batch=1, tolerance=0.0):
    """The Python API's arguments, checked before anything is traced or
    compiled (otherwise a pybind signature dump or a Dynamo assertion)."""
    if not callable(model_or_fn):
        raise TypeError(f"torch_pjrt: readiness: model_or_fn must be an nn.Module or a callable, "
                        f"got {type(model_or_fn).__name__}")
    if not isinstance(topology, str) or not topology:
        raise TypeError(f"torch_pjrt: readiness: topology must be a name such as 'v5e:2x2', got {topology!r}")
    for name, value in (("chips", chips), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"torch_pjrt: readiness: {name} must be an int >= 1, got {value!r}")
        if value < 1:
            raise ValueError(f"torch_pjrt: readiness: {name} must be >= 1, got {value}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise TypeError(f"torch_pjrt: readiness: tolerance must be a number >= 0, got {tolerance!r}")
    if not tolerance >= 0:  # also NaN
        raise ValueError(f"torch_pjrt: readiness: tolerance must be >= 0 (a fraction), got {tolerance}")


def check_programs(programs, persistent, topology, chips, mode, batch_size, save_dir=None, keep_hlo=True):
    check_batch_splits(batch_size, chips)
    figures, (kind, n_devices, memory, peak, cores) = compile_programs(programs, persistent, topology, chips, save_dir,
                                                                keep_hlo)
    # The step's peak: the largest program's peak plus what stays in memory
    # besides its own arguments (weights and optimizer state between programs).
    step_peak = max((f.peak_bytes + f.resident_other_bytes for f in figures), default=0)
    estimates = [f.estimate_seconds for f in figures]
    return Report(
        topology=topology, generation=roofline.generation_of(kind), device_kind=kind,
        devices_in_topology=n_devices, devices_per_chip=cores, chips=chips, memory_per_chip=memory, mode=mode, batch_size=batch_size,
        programs=figures, step_peak_bytes=step_peak, fits=step_peak <= memory, margin_bytes=memory - step_peak,
        step_flops=sum(f.flops for f in figures), step_bytes_accessed=sum(f.bytes_accessed for f in figures),
        step_estimate_seconds=sum(estimates) if estimates and None not in estimates else None,
        peak_flops_per_device=peak[0] if peak else None, bandwidth_per_device=peak[1] if peak else None)


def batch_of(inputs):
    leaves = [t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.dim()]
    return leaves[0].shape[0] if leaves else None


def with_batch(inputs, old, new):
    """`inputs` with every tensor whose first dimension is the batch resized to `new` (placeholders)."""
    def one(t):
        if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == old:
            return torch.empty((new, *t.shape[1:]), dtype=t.dtype, device="meta")
        return t
    return torch.utils._pytree.tree_map(one, inputs)


def search_largest(peak, step, max_batch, memory, known=None, max_compiles=32, tolerance=0.0):
    """The largest multiple of `step` up to `max_batch` with peak(b) <= memory
    (peak growing with b), None when `step` itself does not fit. peak(b)
    compiles; known: (batch, its peak) already compiled.

    Peak memory is close to affine in the batch (weights + per-item
    activations), so the next batch tried is where the line through the two
    nearest compiled points crosses the chip's memory: rounded up while no
    batch is known not to fit (to get a bound), rounded down inside a bound;
    the geometric middle of a bound wider than 4x, bisection after a
    prediction inside the bound. An affine peak takes 4-8 compiles.
    tolerance: stop once the batch known not to fit is within this fraction
    above the one that fits (0: exact to `step`); returns (fits, does not fit
    or None)."""
    seen = dict([known]) if known else {}

    def at(b):
        if b not in seen:
            seen[b] = peak(b)
        return seen[b]
    if at(step) > memory:
        return None, step
    top = max_batch // step * step
    interpolated = False
    for _ in range(max_compiles):
        lo = max(b for b, p in seen.items() if p <= memory)
        failing = [b for b, p in seen.items() if p > memory]
        hi = min(failing) if failing else None
        if lo >= top or (hi is not None and hi - lo <= max(step, tolerance * lo)):
            break
        # The line through the two fitting points nearest the bound (a
        # refused program's figure is only "more than the chip").
        fitting = [(b, p) for b, p in seen.items() if p <= memory]
        (b0, p0), (b1, p1) = (sorted(fitting, key=lambda kv: abs(kv[0] - lo)) + [(None, None)])[:2]
        slope = (p1 - p0) / (b1 - b0) if b1 is not None and b1 != b0 else 0
        if hi is not None and lo * 4 < hi:
            # A wide bound (the line from small batches overshot): its
            # geometric middle; smaller batches also compile faster.
            cand, interpolated = int(math.sqrt(lo * hi)), False
        elif slope <= 0 or (hi is not None and (interpolated or hi - lo <= 64 * step)):
            # No usable line, or the last try inside the bound was a
            # prediction: halve the bound (peaks padded to tile sizes are steps).
            cand, interpolated = ((lo + hi) // 2 if hi is not None else 2 * lo), False
        else:
            cross = lo + (memory - seen[lo]) / slope
            cand = -(-int(cross) // step) * step if hi is None else int(cross)
            interpolated = hi is not None
        cand = cand // step * step if hi is not None else cand
        at(min(max(cand, lo + step), hi - step if hi is not None else top))
    failing = [b for b, p in seen.items() if p > memory]
    return max(b for b, p in seen.items() if p <= memory), (min(failing) if failing else None)
