"""A compiled FX graph: one XLA executable per input signature.

AOTAutograd calls this with real tpu tensors (boxed: one list). The first
call with a new signature (shapes, dtypes, devices, int values) lowers the
graph for those shapes and compiles it; later calls with that signature run
the executable at once.
"""
import math
import os
import sys
import time
import warnings

import torch

from .. import _state
from . import capture, stats
from .cpu_refusal import cpu_refusal
from torch.utils._pytree import tree_flatten

from .lower_graph import NeedsValue, Unsupported, _Int, any_downstream, int_pack, lower_graph, split_host
from .partition import partition

_warned_ops = set()


def _signature(args, unkeyed=()):
    # Shapes, dtypes and devices (not strides: the program reads any layout,
    # and view ops' values do not depend on it); host values by value, except
    # those only the host reads or the program takes at run time (`unkeyed`);
    # and whether value checks are on (programs with and without them differ).
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else (type(a), None if i in unkeyed else a)
                 for i, a in enumerate(args)) + (("checks", _state.C.checks_enabled()),)


def _is_scalar(n):
    return not isinstance(n.meta.get("val"), torch.Tensor) and "val" in n.meta


def _host_only_inputs(gm):
    """Positions of the scalar inputs (ints Dynamo made SymInts, e.g. a cache's
    position counter) that only scalar arithmetic reads, ending in the graph's
    outputs: the host part computes those per call (split_host), so the
    program does not depend on their values and one executable serves all."""
    nodes = list(gm.graph.nodes)
    output = nodes[-1]
    scalar = set()  # nodes computed from scalars alone: on the host for any input devices
    for n in nodes:
        if n.op == "placeholder" and _is_scalar(n):
            scalar.add(n)
        elif n.op == "call_function" and _is_scalar(n) and n.all_input_nodes and \
                all(i in scalar for i in n.all_input_nodes):
            scalar.add(n)
    direct = set(output.all_input_nodes)  # returned as is: the template would keep its value
    placeholders = [n for n in nodes if n.op == "placeholder"]
    return {k for k, p in enumerate(placeholders)
            if p in scalar and p not in direct and not any_downstream(p, lambda u: u not in scalar)}


def _runtime_int_inputs(gm, skip):
    """(positions, sizes) of the int inputs (SymInts Dynamo made of a Python
    int that changed: a position, a step, an index) the program may take at
    run time (x[n], x * n, arange(n, n + k)), one executable for all values.
    An int no size or stride in the graph depends on qualifies; so does one
    that sizes depend on through expressions of such int inputs alone (a batch
    `source[i:i + min(35, len - 1 - i)]`): `sizes(args)` then evaluates those
    expressions for a call, and the signature holds their values instead of
    the int's. lower_graph narrows the positions where an op needs a value
    (NeedsValue)."""
    exprs = set()  # the graph's symbolic sizes and strides
    for n in gm.graph.nodes:
        for t in tree_flatten(n.meta.get("val"))[0]:
            if isinstance(t, torch.Tensor):
                try:
                    dims = list(t.shape) + list(t.stride())
                except RuntimeError:  # (layouts without strides)
                    dims = list(t.shape)
                exprs.update(d.node.expr for d in dims if isinstance(d, torch.SymInt))
    sized = set().union(*(e.free_symbols for e in exprs))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ints = {i: p.meta["val"].node.expr for i, p in enumerate(placeholders)
            if i not in skip and isinstance(p.meta.get("val"), torch.SymInt) and p.meta["val"].node.expr.free_symbols}
    bare = {e: i for i, e in ints.items() if e.is_Symbol}
    out, keyed = [], set()
    for i, e in ints.items():
        if not e.free_symbols & sized:
            out.append(i)
        elif e.is_Symbol:
            related = {x for x in exprs if e in x.free_symbols}
            if all(x.free_symbols <= bare.keys() for x in related):
                out.append(i)
                keyed |= related
    sizes = _size_function(sorted(keyed, key=str), bare) if keyed else None
    if keyed and sizes is None:  # (an expression Python cannot evaluate: those ints keyed)
        out = [i for i in out if not ints[i].free_symbols & sized]
    return tuple(out), sizes


def _size_function(exprs, bare):
    """args -> the values of `exprs` (sympy, over the bare int inputs'
    symbols) for a call's arguments; None if they do not print as Python."""
    from torch.utils._sympy.printers import PythonPrinter
    symbols = sorted(set().union(*(e.free_symbols for e in exprs)), key=str)
    try:
        body = ", ".join(PythonPrinter().doprint(e) for e in exprs)
        inner = eval(f"lambda {', '.join(map(str, symbols))}: ({body},)", {"math": math})  # noqa: S307
    except Exception:  # noqa: BLE001 - printed code that does not parse
        return None
    positions = [bare[s] for s in symbols]
    return lambda args: inner(*[args[i] for i in positions])


def _describe_change(old, new, names):
    changes = []
    for i, (o, n) in enumerate(zip(old, new)):
        if o == n:
            continue
        if o[0] == "sizes":  # sizes computed from int inputs the program takes at run time
            changes.append(f"sizes set by int inputs {_fmt(o[1])} -> {_fmt(n[1])}")
            continue
        if o[0] == "checks":
            changes.append(f"value checks {'on' if o[1] else 'off'} -> {'on' if n[1] else 'off'}")
            continue
        label = f"input {i} ({names[i]})" if i < len(names) else f"tensor input {i}"
        if isinstance(o[0], tuple) and isinstance(n[0], tuple):  # tensors: (shape, dtype, device)
            for what, k in (("shape", 0), ("dtype", 1), ("device", 2)):
                if o[k] != n[k]:
                    changes.append(f"{label} {what} {_fmt(o[k])} -> {_fmt(n[k])}")
        else:
            changes.append(f"{label} {_fmt(o[-1])} -> {_fmt(n[-1])}")
    if len(old) != len(new):
        changes.append(f"number of inputs {len(old)} -> {len(new)}")
    return "; ".join(changes) or "no input changed (guards)"


def _fmt(v):
    return "(" + ", ".join(str(e) for e in v) + ")" if isinstance(v, (tuple, torch.Size)) else str(v)


def _unpack(outs, host_values, inputs, entry, args):
    kind = entry[0]
    if kind == "t":
        return outs[entry[1]]
    if kind == "h":
        return host_values[entry[1]]
    if kind == "v":
        _, k, size, stride, offset = entry
        base = outs[k]
        return base.as_strided(size, stride, base.storage_offset() + offset)
    if kind == "i":  # a view of tensor input k (in another dtype: the same bytes read as it)
        _, k, size, stride, offset, *dtype = entry
        base = inputs[k]
        if dtype:
            start = base.storage_offset() * base.element_size() // dtype[0].itemsize
            return torch.empty(0, dtype=dtype[0], device=base.device).set_(
                base.untyped_storage(), start + offset, size, stride)
        return base.as_strided(size, stride, base.storage_offset() + offset)
    if kind == "n":  # an int the program took at run time: this call's
        return entry[1](args)
    if kind == "r":  # a view at a runtime int's offset: its view ops again, with this call's ints
        _, source, k, chain = entry
        v = inputs[k] if source == "i" else outs[k]
        for op, (op_args, op_kwargs), pos, index in chain:
            op_args = [a.host(args) if isinstance(a, _Int) else a for a in op_args]
            v = op(*op_args[:pos], v, *op_args[pos + 1:], **op_kwargs)
            v = v if index is None else v[index]
        return v
    return entry[1]


def _lift_tensor_constants(gm):
    """Tensor constants of the graph (`torch.tensor([0, 2])` inside a compiled
    function becomes a get_attr of `_tensor_constant0`) turned into extra
    inputs after the graph's own: the program reads them like any input (CPU
    ones are packed into its CPU transfer), instead of the graph being cut
    around them. Returns the tensors, to be appended to every call's inputs."""
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"
             and isinstance(getattr(gm, n.target, None), torch.Tensor)]
    # Constants of control-flow subgraphs (a cond branch, a scan step) stay
    # get_attr nodes there; their tensors become inputs too, which the walk
    # finds by identity (_Walker.attribute) and regions read from outside.
    inner = []
    for sub in gm.modules():
        if sub is not gm and isinstance(sub, torch.fx.GraphModule):
            for n in sub.graph.nodes:
                t = getattr(sub, n.target, None) if n.op == "get_attr" else None
                if isinstance(t, torch.Tensor) and not any(t is c for c in inner):
                    inner.append(t)
    if not attrs and not inner:
        return []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = []
    anchor = placeholders[-1] if placeholders else None

    def placeholder(name):
        # New placeholders go after the graph's own (before everything when it has none).
        nonlocal anchor
        where = gm.graph.inserting_after(anchor) if anchor is not None else \
            gm.graph.inserting_before(next(iter(gm.graph.nodes)))
        with where:
            anchor = gm.graph.placeholder(name)
        return anchor

    for n in attrs:
        p = placeholder(f"{n.name}_lifted")
        p.meta.update(n.meta)
        n.replace_all_uses_with(p)
        gm.graph.erase_node(n)
        constants.append(getattr(gm, n.target))
    for k, t in enumerate(inner):
        placeholder(f"_subgraph_constant{k}_lifted")
        constants.append(t)
    gm.recompile()
    return constants


def _run_program(cg, lowered, tensors, args):
    """The program's outputs (None where it holds for another view geometry); its runtime
    ints go in one s64 pack after the tensors."""
    return cg.run(tensors + [int_pack(args, lowered.runtime_ints)] if lowered.runtime_ints else tensors)


class CompiledGraphFn:
    def __init__(self, gm, name, after_recompile=False, is_piece=False):
        # AOTAutograd passes one list, which we clear. (An instance attribute:
        # the wrappers AOTAutograd puts around a backward copy only __dict__.)
        self._boxed_call = True
        self.gm = gm
        self.name = name
        self.after_recompile = after_recompile  # made by a Dynamo recompile: log its first compile too
        self.is_piece = is_piece  # a piece of a partitioned graph: not partitioned again
        self.entries = {}  # signature -> [(C.CompiledGraph, Lowered)], or [None]: run eagerly
        self.last_signature = None
        self.constants = _lift_tensor_constants(gm)
        self.placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.host_only = _host_only_inputs(gm)
        self.runtime_ints, self.sizes = _runtime_int_inputs(gm, self.host_only)
        self.unkeyed = self.host_only | set(self.runtime_ints)

    def __call__(self, *args):
        # Boxed (one list, which we clear to free inputs early) or, when a
        # wrapper dropped the _boxed_call mark, positional.
        args = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        args.extend(self.constants)
        if capture.active() is not None:
            return self._capture(args)
        sig = self._signature(args)
        candidates = self.entries.get(sig)
        if not candidates:
            entry = self._compile(args, sig)
            sig = self._signature(args)  # (compiling may have keyed more ints)
            candidates = self.entries[sig] = [entry]
        self.last_signature = sig
        if candidates[0] is None:
            return self._run_eagerly(args)
        if isinstance(candidates[0], torch.fx.GraphModule):  # pieces, see partition.py
            result = candidates[0](*args)
            args.clear()
            return list(result) if isinstance(result, tuple) else result
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        outs = None
        evicted = False
        for cg, lowered in list(candidates):
            # Programs that read view inputs in place hold for one view geometry.
            outs = _run_program(cg, lowered, tensors, args)
            if outs is not None:
                break
            if not cg.resident():  # evicted from the bounded executable cache
                candidates.remove((cg, lowered))
                evicted = True
        if outs is None:
            entry = self._compile(args, sig, evicted)
            if entry is None:
                return self._run_eagerly(args)
            new_sig = self._signature(args)
            if new_sig == sig:
                candidates.append(entry)
            else:  # (compiling keyed more ints)
                self.entries[new_sig] = [entry]
            cg, lowered = entry
            outs = _run_program(cg, lowered, tensors, args)
        # The host part (it may update CPU inputs in place, e.g. step += 1)
        # runs after the program has read their values from before.
        host_values = lowered.host(args) if lowered.host else ()
        result = [_unpack(outs, host_values, tensors, t, args) for t in lowered.output_template]
        args.clear()
        stats.COUNTERS["compiled_graph_runs"] += 1
        return result

    def _signature(self, args):
        sig = _signature(args, self.unkeyed)
        if not self.sizes:
            return sig
        try:
            return sig + (("sizes", self.sizes(args)),)
        except Exception:  # noqa: BLE001 - printed code Python cannot run: every int keyed instead
            self.sizes, self.runtime_ints, self.unkeyed = None, (), set(self.host_only)
            return _signature(args, self.unkeyed)

    def _capture(self, args):
        # A dry run (capture.py): lower and record; the outputs are placeholders.
        lowered = lower_graph(self.gm, args, split_host(self.gm, args))
        capture.active().record(self.name, lowered, args)
        outs = capture.placeholder_outputs(lowered)
        host_values = lowered.host(args) if lowered.host else ()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        result = [_unpack(outs, host_values, tensors, t, args) for t in lowered.output_template]
        args.clear()
        return result

    def _forget_evicted(self):
        # Signatures whose executables the bounded cache evicted: drop what
        # Python keeps for them too, so memory stays flat with ever new shapes.
        for sig in [s for s, c in self.entries.items()
                    if c and isinstance(c[0], tuple) and not any(cg.resident() for cg, _ in c)]:
            del self.entries[sig]

    def _run_eagerly(self, args):
        stats.COUNTERS["eager_graph_fallbacks"] += 1
        result = self.gm(*args)
        args.clear()
        return result

    def _lower(self, args):
        while True:
            try:
                return lower_graph(self.gm, args, split_host(self.gm, args), self.runtime_ints)
            except NeedsValue as e:
                keyed = [i for i in self.runtime_ints if i in e.origins]
                if not keyed:
                    raise RuntimeError(f"torch_pjrt: graph '{self.name}': {e} (not a runtime input)") from e
                self.runtime_ints = tuple(i for i in self.runtime_ints if i not in e.origins)
                self.unkeyed = self.host_only | set(self.runtime_ints)
                names = ", ".join(self.placeholders[i] for i in keyed)
                stats.log("recompiles", f"graph '{self.name}': {names} key the program: {e}")

    def _compile(self, args, sig, evicted=False):
        t0 = time.perf_counter()
        compiles0 = _state.C.metrics()["xla_compiles"]
        try:
            lowered = self._lower(args)
        except Unsupported as e:
            pieces = None if self.is_piece else partition(
                self.gm, self.name, lambda sub, name: CompiledGraphFn(sub, name, is_piece=True))
            if e.op not in _warned_ops:
                _warned_ops.add(e.op)
                how = ("the ops around it are compiled in pieces, it runs op by op" if pieces is not None
                       else "the graph runs op by op (eager)")
                warnings.warn(f"torch_pjrt: graph '{self.name}': cannot lower {e}; {how}", stacklevel=3)
            if pieces is not None:
                stats.COUNTERS["partitioned_graphs"] += 1
            return pieces
        t1 = time.perf_counter()
        if os.environ.get("TORCH_PJRT_DUMP", "") not in ("", "0"):
            print(f"// torch_pjrt graph '{self.name}'\n{lowered.text}", file=sys.stderr)
        try:
            cg = _state.C.CompiledGraph(lowered.prog, lowered.text, lowered.outputs, lowered.mutations,
                                        lowered.device, self.name, lowered.replica_ids)
        except RuntimeError as e:
            refusal = cpu_refusal(self.gm, self.name) if "compile failed in PJRT plugin" in str(e) else None
            if refusal is not None:
                raise refusal from e
            raise
        lowered.prog = lowered.text = None  # the builder's text is not needed to run
        self._forget_evicted()
        t2 = time.perf_counter()
        stats.COUNTERS["compiled_graphs"] += 1
        stats.COUNTERS["graph_compile_seconds"] += t2 - t0
        xla = _state.C.metrics()["xla_compiles"] - compiles0
        cost = (f"{t2 - t0:.3f} s (lowering {t1 - t0:.3f} s, "
                f"{'XLA compile' if xla else 'loaded from the persistent cache'} {t2 - t1:.3f} s)")
        if self.entries:  # this graph was compiled before, for other inputs
            stats.COUNTERS["graph_recompiles"] += 1
            why = ("its executable was evicted from the bounded in-memory cache" if evicted
                   else _describe_change(self.last_signature, sig, self.placeholders) if sig not in self.entries
                   else "a view input's geometry (strides or storage size) changed")
            versions = sum(len(v) for v in self.entries.values()) + 1
            stats.log("recompiles", f"graph '{self.name}' recompiled: {why}; cost {cost}; {versions} versions")
        elif self.after_recompile:
            stats.log("recompiles", f"graph '{self.name}' (from the Dynamo recompile) compiled: cost {cost}")
        stats.log("graphs", f"graph '{self.name}' compiled: {len(self.gm.graph.nodes)} nodes, cost {cost}")
        return (cg, lowered)
