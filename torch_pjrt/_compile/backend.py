"""The "tpu" backend of torch.compile: Dynamo captures a graph, AOTAutograd
splits it into forward and backward ATen graphs (functional, with PyTorch's
decompositions for ops the registry has no lowering for), and each becomes one
CompiledGraphFn."""
import functools
import itertools
import time
import warnings

import torch

from . import stats
from .graph_fn import CompiledGraphFn, _describe_change
from .lower_graph import is_view, registry_lowering

_graph_ids = itertools.count()
_frames = {}  # Dynamo frame id -> signature of the example tensors it last captured


@functools.lru_cache(maxsize=1)
def decompositions():
    """PyTorch's core ATen decompositions, for the ops the registry does not
    lower itself (a lowering is preferred: it is usually one fused op)."""
    from torch._decomp import core_aten_decompositions, decomposition_table
    table = {}
    # Views are not decomposed: the walk reads any view from its base's
    # layout, and detach decomposed into alias made scan's functionalization
    # see a carry aliasing an output (an RNN cell's scan could not train).
    for op, fn in core_aten_decompositions().items():
        if isinstance(op, torch._ops.OpOverload) and registry_lowering(op._schema) is None \
                and not is_view(op._schema):
            table[op] = fn
    # Random factories and *_like ops: written with the random ops the
    # registry lowers (PyTorch has no decomposition of them).
    from .random_decomps import TABLE
    for op, fn in TABLE.items():
        table.setdefault(op, fn)
    # An op that writes an argument that is not an out= one keeps PyTorch's
    # decomposition even where it is lowered: a composite reaching it below
    # AOTAutograd's functionalization (native_batch_norm(out=) on tpu makes
    # _native_batch_norm_legit, which updates the running stats) would leave
    # a mutation in the graph, which AOTAutograd refuses.
    for op, fn in decomposition_table.items():
        if isinstance(op, torch._ops.OpOverload) and any(
                a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only for a in op._schema.arguments) \
                and not op._schema.name.endswith("_") and registry_lowering(op._schema) is not None:
            table.setdefault(op, fn)
    return table


def _dim(d):
    return str(d.node.expr) if isinstance(d, torch.SymInt) else str(d)  # "s75" for a dynamic size


def _note_capture(example_inputs):
    """Counts Dynamo's graphs; a second graph for one frame is a recompile.
    Returns the recompile's description, or None."""
    stats.COUNTERS["dynamo_graphs"] += 1
    from torch._guards import CompileContext
    cid = CompileContext.current_compile_id()
    # Tensors only: a recompile that makes a size dynamic adds SymInt inputs.
    sig = tuple((tuple(_dim(d) for d in a.shape), a.dtype, a.device)
                for a in example_inputs if isinstance(a, torch.Tensor))
    if cid is None:
        return None
    frame, why = cid.frame_id, None
    if frame in _frames and cid.frame_compile_id:
        stats.COUNTERS["dynamo_recompiles"] += 1
        why = (f"Dynamo recompiled frame {frame} (#{cid.frame_compile_id}): "
               f"{_describe_change(_frames[frame], sig, [])}")
    _frames[frame] = sig
    return why


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_warned_options = set()


def _check_options(kwargs):
    """torch.compile's mode= and options= reach a named backend as keyword
    arguments. The modes Inductor knows are accepted (each compiles the same
    program here); an unknown one raises as Inductor's check does. options=
    (Inductor's settings) have no meaning here: named once in a warning, not
    silently dropped."""
    kwargs = dict(kwargs)
    mode = kwargs.pop("mode", None)
    if mode is not None and mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_MODES)}")
    extra = sorted(set(kwargs.pop("options", None) or {}) | set(kwargs))
    new = [k for k in extra if k not in _warned_options]
    if new:
        _warned_options.update(new)
        warnings.warn(f"torch_pjrt: the tpu backend ignores these torch.compile options: {', '.join(new)} "
                      "(they are Inductor's; XLA compiles every graph with its own settings)", stacklevel=2)


def tpu_backend(gm, example_inputs, **options):
    from torch._dynamo.backends.common import aot_autograd
    _check_options(options)
    recompile = _note_capture(example_inputs)
    gid = next(_graph_ids)
    t0 = time.perf_counter()

    def compiler(kind):
        def compile_graph(fx_graph, _inputs):
            return CompiledGraphFn(fx_graph, f"{kind}{gid}", after_recompile=bool(recompile))
        return compile_graph

    compiled = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                            inference_compiler=compiler("inference"), decompositions=decompositions(),
                            keep_inference_input_mutations=True)(gm, example_inputs)
    if recompile:
        stats.log("recompiles", f"{recompile}; AOTAutograd tracing {time.perf_counter() - t0:.3f} s "
                  f"(graphs *{gid}: their lowering and XLA costs follow when they first run; Dynamo traces "
                  "changed sizes as dynamic where it can, TORCH_LOGS=recompiles names the failed guard)")
    return compiled


def register():
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import _COMPILER_FNS
    if "tpu" not in _COMPILER_FNS:
        register_backend(tpu_backend, name="tpu")
    from . import rng_state
    rng_state.install()
