"""Higher-order ops a graph walk lowers itself (a mixin of lower_graph's
_Walker): control flow as regions of stablehlo.if / stablehlo.while
(torch.cond, while_loop, scan, map), nested compile regions walked in place,
and activation checkpointing's random state as a key value
(docs/ARCHITECTURE.md, "control flow")."""
import torch
from torch.utils._pytree import tree_flatten

from .values import _META, Unsupported, _dense_meta, _type, _Val

# Higher-order ops the walk lowers itself: op name -> _Walker method. Control
# flow becomes regions; activation checkpointing's random state a key value.
_LOWERED_HOPS = {"cond": "cond", "while_loop": "while_loop", "scan": "scan", "map_impl": "map_impl",
                 "run_and_save_rng_state": "run_and_save_rng_state", "run_with_rng_state": "run_with_rng_state",
                 "invoke_subgraph": "invoke_subgraph"}


class HigherOrderOps:
    """Needs self.prog (a GraphProgram), self.walk, self.call_op, and the
    walker's loop_depth and forced_rng."""

    # ---- control flow: torch.cond -> stablehlo.if, while_loop / scan / map -> stablehlo.while ----
    def subgraph(self, gm, inputs):
        out = self.walk(gm.graph, inputs)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def yield_id(self, v, like):
        """The id of subgraph result `v` as a value of `like`'s type (a meta)."""
        if not isinstance(v, _Val):
            if isinstance(v, (bool, int, float)):
                return self.prog.convert(self.prog.constant(v, like.dtype), like.dtype, list(like.shape))
            raise Unsupported("control flow", f"a subgraph result of type {type(v).__name__}")
        if _type(v.meta) == _type(like):
            return v.id
        if list(v.meta.shape) != list(like.shape):
            raise Unsupported("control flow", f"a subgraph result of shape {list(v.meta.shape)} "
                              f"where {list(like.shape)} is expected")
        return self.prog.convert(v.id, like.dtype, list(like.shape))

    def close(self, ids, yields_code):
        try:
            return self.prog.close_region(ids, yields_code)
        except RuntimeError as e:
            raise Unsupported("control flow", str(e)) from e

    def region_args(self, metas, loop):
        return [_Val(i, m) for i, m in zip(self.prog.open_region([_type(m) for m in metas], loop), metas)]

    def cond(self, node, args, kwargs):
        pred, then_gm, else_gm, operands = args[:4]
        operands = list(operands)
        if not isinstance(pred, _Val):  # a host bool: only that branch
            return tuple(self.subgraph(then_gm if pred else else_gm, operands))
        if pred.meta.numel() != 1:
            raise Unsupported("cond", f"a predicate of shape {list(pred.meta.shape)}")
        regions, metas = [], None
        for gm in (then_gm, else_gm):
            self.prog.open_region([], False)
            outs = self.subgraph(gm, operands)
            if metas is None:
                metas = [_dense_meta(v) for v in outs]
            if len(outs) != len(metas):
                raise Unsupported("cond", "branches with different numbers of results")
            regions.append(self.close([self.yield_id(v, m) for v, m in zip(outs, metas)], True))
        ids = self.prog.if_op(pred.id, *regions)
        return tuple(_Val(i, m) for i, m in zip(ids, metas))

    def while_loop(self, node, args, kwargs):
        cond_gm, body_gm, carried, additional = args[:4]
        carried, additional = list(carried), list(additional)
        if not all(isinstance(c, _Val) for c in carried):
            raise Unsupported("while_loop", "a loop-carried Python number")
        metas = [_dense_meta(c) for c in carried]
        self.loop_depth += 1
        try:
            out = self.subgraph(cond_gm, self.region_args(metas, True) + additional)
            if len(out) != 1:
                raise Unsupported("while_loop", "a condition with more than one result")
            cond = self.close([self.yield_id(out[0], torch.empty((), dtype=torch.bool, device=_META))], False)
            out = self.subgraph(body_gm, self.region_args(metas, True) + additional)
            if len(out) != len(metas):
                raise Unsupported("while_loop", "a body whose results do not match the carried values")
            body = self.close([self.yield_id(v, m) for v, m in zip(out, metas)], True)
        finally:
            self.loop_depth -= 1
        ids = self.prog.while_op([c.id for c in carried], cond, body)
        return tuple(_Val(i, m) for i, m in zip(ids, metas))

    def scan(self, node, args, kwargs):
        """scan(combine, init, xs, additional) over dim 0 of xs: a while loop
        carrying a counter, the carry and the stacked outputs, the slices
        read and written at the counter."""
        combine, init, xs, additional = args[:4]
        init, xs, additional = list(init), list(xs), list(additional)
        if not xs or not all(isinstance(v, _Val) for v in init + xs):
            raise Unsupported(node.target, "no scanned tensors, or a Python number carried")
        length = xs[0].meta.shape[0]
        carry_metas = [_dense_meta(c) for c in init]
        slice_metas = [torch.empty(x.meta.shape[1:], dtype=x.meta.dtype, device=_META) for x in xs]
        y_metas = self.step_metas(node, combine, carry_metas + slice_metas, additional, len(init))[len(init):]
        stacked = [torch.empty((length, *m.shape), dtype=m.dtype, device=_META) for m in y_metas]
        counter = torch.empty((), dtype=torch.int64, device=_META)
        metas = [counter] + carry_metas + stacked
        init_ids = [self.prog.constant(0, torch.int64)] + [c.id for c in init] + [
            self.prog.convert(self.prog.constant(0, m.dtype), m.dtype, list(m.shape)) for m in stacked]
        self.loop_depth += 1
        try:
            a = self.region_args(metas, True)
            cond = self.close([self.prog.index_below(a[0].id, length)], False)
            a = self.region_args(metas, True)
            i, carry, acc = a[0], a[1:1 + len(init)], a[1 + len(init):]
            slices = [_Val(self.prog.slice_at(x.id, i.id), m) for x, m in zip(xs, slice_metas)]
            out = self.subgraph(combine, carry + slices + additional)
            if len(out) != len(init) + len(y_metas):
                raise Unsupported(node.target, "a step with an unexpected number of results")
            ys = [self.prog.update_at(acc_k.id, self.yield_id(y, m), i.id)
                  for acc_k, y, m in zip(acc, out[len(init):], y_metas)]
            body = self.close([self.prog.index_next(i.id)] + [self.yield_id(v, m) for v, m in zip(
                out[:len(init)], carry_metas)] + ys, True)
        finally:
            self.loop_depth -= 1
        ids = self.prog.while_op(init_ids, cond, body)
        return tuple(_Val(i, m) for i, m in zip(ids[1:], metas[1:]))

    def step_metas(self, node, combine, metas, additional, n_carry):
        """The metas of a scan step's results (carry, then one slice of each
        output): from what PyTorch traced for the node when static, else from
        a walk of the step in a region never emitted (a cond inside a step
        has no meta kernel to run)."""
        traced = tree_flatten(node.meta.get("val"))[0] if isinstance(node, torch.fx.Node) else []
        if traced and all(isinstance(t, torch.Tensor) and all(isinstance(d, int) for d in t.shape) for t in traced):
            return [torch.empty(t.shape[1 if k >= n_carry else 0:], dtype=t.dtype, device=_META)
                    for k, t in enumerate(traced)]
        self.loop_depth += 1
        try:
            outs = self.subgraph(combine, self.region_args(metas, False) + additional)
            self.close([], True)
        finally:
            self.loop_depth -= 1
        return [_dense_meta(v) for v in outs]

    def map_impl(self, node, args, kwargs):
        f, xs, pos_args = args[:3]
        return self.scan(node, (f, [], xs, pos_args), kwargs)

    def invoke_subgraph(self, node, args, kwargs):
        """torch.compiler.nested_compile_region: its subgraph, walked in place."""
        subgraph, _identifier, *operands = args
        if not isinstance(subgraph, torch.fx.GraphModule):
            raise Unsupported("invoke_subgraph", f"a subgraph of type {type(subgraph).__name__}")
        return tuple(self.subgraph(subgraph, operands))

    # ---- activation checkpointing's random state (rng_state.py): the op's key ----
    def run_and_save_rng_state(self, node, args, kwargs):
        op, *rest = args
        key = self.prog.rng_key()
        self.rng_states.add(key)  # (a tpu tensor: PyTorch's trace says a CPU generator state)
        return (_Val(key, torch.empty(2, dtype=torch.int64, device=_META)), self.with_key(key, op, rest, kwargs))

    def run_with_rng_state(self, node, args, kwargs):
        state, op, *rest = args
        if not isinstance(state, _Val) or _type(state.meta) != (torch.int64, [2]):
            raise Unsupported("run_with_rng_state", "a random state that is not a tpu key")
        return self.with_key(state.id, op, rest, kwargs)

    def with_key(self, key, op, args, kwargs):
        saved, self.forced_rng = self.forced_rng, key
        try:
            return self.call_op(op, list(args), kwargs)
        finally:
            self.forced_rng = saved
