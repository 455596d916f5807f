"""torch.cond, while_loop, scan and map under torch.compile(backend="tpu"):
each graph is one program (stablehlo.if / stablehlo.while), not pieces
around a host read. Results and gradients against the same functions on
CPU (eager); float32, tolerance 1e-5 absolute unless said."""
import warnings

import pytest
import torch
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import torch_pjrt

DEV = "tpu"


def _counts():
    m = torch_pjrt.metrics()
    return m["compiled_graphs"], m.get("partitioned_graphs", 0), m.get("eager_graph_fallbacks", 0)


def run_both(fn, *args, grad=False, atol=1e-5):
    """fn on CPU (eager) and compiled on tpu: results (and input gradients)
    agree; returns (compiled graphs, partitioned, eager-run graphs, warnings)."""
    torch._dynamo.reset()
    cpu = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    dev = [a.detach().to(DEV).requires_grad_(a.requires_grad) for a in args]
    before = _counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = fn(*cpu)
        out = torch.compile(fn, backend="tpu", fullgraph=True)(*dev)
        ref_flat, out_flat = (torch.utils._pytree.tree_flatten(r)[0] for r in (ref, out))
        assert len(ref_flat) == len(out_flat)
        for r, o in zip(ref_flat, out_flat):
            assert o.device.type == DEV and o.dtype == r.dtype and o.shape == r.shape
            torch.testing.assert_close(o.cpu(), r, atol=atol, rtol=1e-5)
        if grad:
            sum(r.float().sum() for r in ref_flat).backward()
            sum(o.float().sum() for o in out_flat).backward()
            for c, d in zip(cpu, dev):
                if c.requires_grad:
                    torch.testing.assert_close(d.grad.cpu(), c.grad, atol=atol, rtol=1e-5)
    after = _counts()
    ours = [str(w.message) for w in caught if "torch_pjrt" in str(w.message)]
    return tuple(b - a for a, b in zip(before, after)) + (ours,)


def assert_one_program_each(counts, graphs=1):
    compiled, partitioned, eager, ours = counts
    assert (compiled, partitioned, eager) == (graphs, 0, 0), counts
    assert ours == [], ours


X = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
XS = torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
W = torch.randn(3, 3, generator=torch.Generator().manual_seed(3)) * 0.5


def branchy(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a * 2 + b).sin(), lambda a, b: a - b, (x, y))


@pytest.mark.parametrize("sign", [1, -1])
def test_cond_on_a_device_value_is_one_program_taking_either_branch(sign):
    assert_one_program_each(run_both(branchy, sign * X.abs(), Y))


def test_nested_cond_closures_and_results_of_several_dtypes():
    def fn(x, y):
        def inner(a, b):
            return torch.cond(a.mean() > 0.5, lambda u: (u * 3, u.sum().int()), lambda u: (u.exp(), u.int().sum().int()), (b,))
        # y is captured by the false branch (Dynamo lifts it as an operand).
        return torch.cond(x.sum() > 0, inner, lambda a, b: (a + y, (a * b).int().sum().int()), (x, y))
    assert_one_program_each(run_both(fn, X.abs(), Y))
    assert_one_program_each(run_both(fn, -X.abs(), Y))


@pytest.mark.parametrize("sign", [1, -1])
def test_cond_gradients_follow_the_branch_taken(sign):
    # Forward and backward graphs: one program each.
    assert_one_program_each(run_both(branchy, (sign * X.abs()).requires_grad_(), Y.clone().requires_grad_(),
                                     grad=True), graphs=2)


def test_while_loop_with_a_counter_and_additional_inputs():
    def counted(x):
        return while_loop(lambda i, v: i < 5, lambda i, v: (i + 1, v * 2 + 1), (torch.tensor(0, device=x.device), x))

    def until(x, limit):
        return while_loop(lambda v, s: s.sum() < limit.sum(), lambda v, s: (v * 1.5, s + v.abs()),
                          (x, torch.zeros_like(x)))

    def never(x):
        return while_loop(lambda i, v: i < 0, lambda i, v: (i + 1, v * 2), (torch.tensor(0, device=x.device), x))

    assert_one_program_each(run_both(counted, X))
    assert_one_program_each(run_both(until, X, torch.tensor([30.0])))
    assert_one_program_each(run_both(never, X))


def rnn(h0, xs, w):
    def cell(h, x):
        h = torch.tanh(x + h @ w)
        return h, h.sum(-1)
    return scan(cell, h0, xs)


def test_scan_is_one_loop_forward_and_backward():
    assert_one_program_each(run_both(rnn, torch.zeros(3), XS, W))
    # The carry returned as an output too: PyTorch's inductor backend fails
    # on this one (scan's functionalization sees detach's decomposition as an
    # alias); ours keeps views undecomposed.
    assert_one_program_each(run_both(rnn, torch.zeros(3).requires_grad_(), XS.clone().requires_grad_(),
                                     W.clone().requires_grad_(), grad=True, atol=1e-4), graphs=2)


def test_scan_reverse_other_dim_pytrees_and_map():
    def rev(init, xs):
        return scan(lambda c, x: (c * x, c + x), init, xs, reverse=True)

    def dim1(init, xs):
        return scan(lambda c, x: (c + x, x.max()), init, xs, dim=1)

    def trees(a, b, x0, x1):
        def step(c, x):
            return {"a": c["a"] + x[0], "b": c["b"] * 2}, x[1] - c["a"]
        return scan(step, {"a": a, "b": b}, (x0, x1))

    def mapped(xs, y):
        return hop_map(lambda x, y: x * y + 1, xs, y)

    assert_one_program_each(run_both(rev, torch.ones(3), XS))
    assert_one_program_each(run_both(dim1, torch.zeros(6), XS))
    assert_one_program_each(run_both(trees, torch.zeros(3), torch.ones(2), XS, XS * 2))
    assert_one_program_each(run_both(mapped, XS, torch.randn(3)))


def test_an_index_out_of_range_inside_a_scan_step_raises_at_the_read():
    def pick(init, xs, idx):
        return scan(lambda c, x: (c + x[idx], x.sum()), init, xs)
    assert_one_program_each(run_both(pick, torch.zeros(2), XS, torch.tensor([0, 2])))
    torch._dynamo.reset()
    out = torch.compile(pick, backend="tpu")(torch.zeros(2, device=DEV), XS.to(DEV), torch.tensor([0, 7], device=DEV))
    with pytest.raises(IndexError, match="index out of bounds"):
        out[0].cpu()


def test_an_index_check_in_the_branch_not_taken_does_not_raise():
    def fn(x, idx):
        return torch.cond(x.sum() > 0, lambda a, i: a[i] * 2, lambda a, i: a[:2] + 1, (x, idx))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu", fullgraph=True)
    bad = torch.tensor([0, 9], device=DEV)
    torch.testing.assert_close(compiled(-X.abs().to(DEV), bad).cpu(), -X.abs()[:2] + 1)
    out = compiled(X.abs().to(DEV), bad)
    with pytest.raises(IndexError, match="index out of bounds"):
        out.cpu()


def test_random_ops_in_a_scan_step_are_not_lowered_into_the_loop():
    # One key for every iteration would repeat the same mask: the graph runs
    # op by op instead, each step drawing its own numbers, and says why.
    def fn(init, xs):
        return scan(lambda c, x: (c + torch.nn.functional.dropout(x, 0.5), c.sum()), init, xs)
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="a random op inside a while_loop or scan body"):
        carry, _ = torch.compile(fn, backend="tpu")(torch.zeros(4000, device=DEV), torch.ones(4, 4000, device=DEV))
    counts = torch.bincount(carry.cpu().long(), minlength=9)
    # Sums of 4 independent masks scaled by 2: 0, 2, 4, 6, 8 in binomial shares;
    # repeated masks would give only 0 and 8.
    assert counts[[2, 4, 6]].sum() > 2000, counts


@torch.compiler.nested_compile_region
def _region(x, w):
    return torch.relu(x @ w) + 1


def test_a_nested_compile_region_is_part_of_the_program():
    # invoke_subgraph (called twice, forward and backward) walked in place.
    fn = lambda x, w: _region(_region(x, w), w).sum(0)  # noqa: E731
    assert_one_program_each(run_both(fn, X.clone().requires_grad_(), W.clone().requires_grad_(), grad=True),
                            graphs=2)


def test_a_cond_inside_a_scan_step_with_dynamic_shapes():
    # The step's output shapes come from a walk of the step (symbolic sizes in
    # PyTorch's trace; a cond has no meta kernel to run on its own).
    def fn(init, xs):
        def step(c, v):
            return torch.cond(v.sum() > 0, lambda a, b: a + b, lambda a, b: a - b, (c, v)), c.clone()
        return scan(step, init, xs)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu", dynamic=True)
    before = _counts()
    for n in (5, 7):
        xs = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        for o, r in zip(compiled(torch.zeros(3, device=DEV), xs.to(DEV)), fn(torch.zeros(3), xs)):
            torch.testing.assert_close(o.cpu(), r, atol=1e-6, rtol=1e-6)
    compiled_graphs, partitioned, eager = (b - a for a, b in zip(before, _counts()))
    assert partitioned == 0 and eager == 0 and compiled_graphs >= 1


def test_tensor_constants_inside_branches_and_steps_are_program_inputs():
    # torch.tensor([...]) in a subgraph: lifted to an input of the program
    # (a one-element constant would be inlined; these have several elements).
    def branch(x):
        return torch.cond(x.sum() > 0, lambda a: a + torch.tensor([0.25, 0.5], device=a.device), lambda a: a.cos(),
                          (x,))

    def step(init, xs):
        def body(c, x):
            return c.scatter_add(0, torch.tensor([1, 1, 0, 0, 2, 2], device=x.device), x), x.clone()
        return scan(body, init, xs)

    assert_one_program_each(run_both(branch, torch.tensor([1.0, 2.0])))
    assert_one_program_each(run_both(step, torch.zeros(6), torch.randn(5, 6)))
