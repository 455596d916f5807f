"""The readiness check: capture the programs torch.compile(backend="tpu")
makes for one step of a model (inference, or forward + backward + optimizer
step), without running them; compile each for a TPU topology with libtpu;
report per program and per step the peak memory per chip against the chip's
memory, flops, bytes accessed, arithmetic intensity and a roofline time
estimate; search the largest batch that fits by compiling."""
import copy
import dataclasses
import os
import time
from typing import Any, Dict, List, Optional

import torch

from .._compile import capture as capture_mod
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


@dataclasses.dataclass
class Report:
    """One model, one batch, one topology (and chip count)."""
    topology: str
    generation: Optional[str]
    device_kind: str
    devices_in_topology: int
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
    largest_batch: Optional[int] = None

    def to_dict(self):
        d = dataclasses.asdict(self)
        for p in d["programs"]:
            p.pop("hlo_text", None)  # large; kept on the object (and saved files)
        d["estimate"] = "roofline estimate from published peaks, not a measurement"
        return d

    def summary(self):
        fits = "fits" if self.fits else "does NOT fit"
        est = f"{self.step_estimate_seconds * 1e3:.3f} ms (estimate)" if self.step_estimate_seconds else "n/a"
        return (f"{self.topology} x{self.chips} chip(s), batch {self.batch_size}: {fits} "
                f"(peak {self.step_peak_bytes / 2**30:.2f} GiB of {self.memory_per_chip / 2**30:.2f} GiB per chip), "
                f"{self.step_flops / 1e9:.2f} GFLOP per step per chip, step {est}")


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


def _call(fn, inputs):
    if isinstance(inputs, dict):
        return fn(**inputs)
    if isinstance(inputs, tuple):
        return fn(*inputs)
    return fn(inputs)


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
    try:
        with capture_mod.capture() as cap:
            _run_step(cap, tpu_model, _placeholder(inputs), mode, optimizer, loss_fn, remember)
    finally:
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
        r = plugin.plugin().compile(topo, text, 1, chips, chips > 1)
        m, c = r["memory"], r["cost"]
        flops, nbytes = c.get("flops", 0.0), c.get("bytes accessed", 0.0)
        est, bound = roofline.estimate(flops, nbytes, *peak) if peak else (None, None)
        taken = {i[2] for i in prog.inputs if i is not None}
        resident = sum(b for k, b in persistent.items() if k not in taken)
        path = None
        if save_dir:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, f"{prog.name}.{topology.replace(':', '_')}.x{chips}.pjrtexe")
            with open(path, "wb") as f:
                f.write(r["serialized"])
        text_out = hlo.to_text(r["optimized_program"], r["optimized_format"]) if keep_hlo else None
        if save_dir and text_out:
            with open(path[:-len(".pjrtexe")] + ".hlo.txt", "w") as f:
                f.write(text_out)
        figures.append(ProgramFigures(
            name=prog.name, phase=prog.phase, peak_bytes=int(m.get("peak_bytes", 0)), argument_bytes=int(m.get("argument_bytes", 0)),
            output_bytes=int(m.get("output_bytes", 0)), alias_bytes=int(m.get("alias_bytes", 0)),
            temp_bytes=int(m.get("temp_bytes", 0)), code_bytes=int(m.get("generated_code_bytes", 0)),
            flops=flops, bytes_accessed=nbytes, transcendentals=c.get("transcendentals", 0.0),
            arithmetic_intensity=flops / nbytes if nbytes else None, estimate_seconds=est, bound=bound,
            compile_seconds=r["seconds"], resident_other_bytes=resident, hlo_text=text_out, serialized_path=path))
    return figures, (kind, n_devices, memory, peak)


def check_programs(programs, persistent, topology, chips, mode, batch_size, save_dir=None):
    figures, (kind, n_devices, memory, peak) = compile_programs(programs, persistent, topology, chips, save_dir)
    # The step's peak: the largest program's peak plus what stays in memory
    # besides its own arguments (weights and optimizer state between programs).
    step_peak = max((f.peak_bytes + f.resident_other_bytes for f in figures), default=0)
    estimates = [f.estimate_seconds for f in figures]
    return Report(
        topology=topology, generation=roofline.generation_of(kind), device_kind=kind,
        devices_in_topology=n_devices, chips=chips, memory_per_chip=memory, mode=mode, batch_size=batch_size,
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
