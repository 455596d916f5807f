"""torch.compile(backend="tpu"): whole graphs as one program, against eager
on tpu and PyTorch on CPU (tolerances: float32, rtol/atol 1e-5 unless stated)."""
import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import assert_same, make, run_python, tpu, run_json
from examples import models


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counters():
    m = torch_pjrt.metrics()
    return {k: m[k] for k in ("dynamo_graphs", "dynamo_recompiles", "compiled_graphs", "graph_recompiles",
                              "compiled_graph_runs", "eager_graph_fallbacks", "partitioned_graphs")}


def delta(before):
    after = counters()
    return {k: after[k] - before[k] for k in after}


class metrics_delta:
    """with metrics_delta() as md: ...; then md["executions"] is the change."""

    def __enter__(self):
        self.before = torch_pjrt.metrics()
        return self

    def __exit__(self, *exc):
        now = torch_pjrt.metrics()
        self.d = {k: now[k] - self.before[k] for k in now if not isinstance(now[k], dict)}
        self.d["cpu_fallbacks"] = {k: v for k, v in now["cpu_fallbacks"].items()
                                   if v != self.before["cpu_fallbacks"].get(k, 0)}

    def __getitem__(self, key):
        return self.d[key]


# ---- functions --------------------------------------------------------------------------------

def test_function_is_one_program_per_signature():
    def f(x, y):
        return torch.relu(x @ y + 1).sum(dim=1) * 0.5
    cf = torch.compile(f, backend="tpu")
    x, y = make((4, 5)), make((5, 3), seed=1)
    before = counters()
    assert_same(cf(*tpu((x, y))), f(x, y))
    d = delta(before)
    assert d["dynamo_graphs"] == 1 and d["compiled_graphs"] == 1 and d["compiled_graph_runs"] == 1
    before = counters()
    with metrics_delta() as md:
        for _ in range(3):
            assert_same(cf(*tpu((x, y))), f(x, y))
    d = delta(before)
    assert d["compiled_graphs"] == 0 and d["compiled_graph_runs"] == 3
    # (Under TORCH_PJRT_EAGER=fused the test's own eager ops around the calls
    # repeat and compile one fused program: not the graph's.)
    assert md["xla_compiles"] <= md["fused_programs_compiled"]  # (0 in strict eager)


def test_compiled_graph_is_one_execution():
    """All ops of the graph run as ONE program: one execution, no host wait."""
    cf = torch.compile(lambda x: (x.sin() * 2 + x.cos()).exp().sum(0).softmax(0), backend="tpu")
    x = tpu(make((16, 8)))
    cf(x)  # compile
    # (Fused eager records a call into its trace, run at a flush; strict: no-ops.)
    torch_pjrt.fused_flush()
    with metrics_delta() as md:
        y = cf(x)
        torch_pjrt.fused_flush()
    assert md["executions"] == 1 and md["host_waits"] == 0
    assert_same(y, (make((16, 8)).sin() * 2 + make((16, 8)).cos()).exp().sum(0).softmax(0))


def test_views_mutation_and_multiple_outputs():
    def f(x, buf):
        a, b = x.split(2, dim=1)
        t = a.t().contiguous().view(-1)[1::2]
        buf.add_(x.mean(0))  # input mutation: written back to buf
        return t * 3, b.expand(2, *b.shape).sum(0), x[:, 1]
    cf = torch.compile(f, backend="tpu")
    x, buf = make((3, 4)), make((4,), seed=2)
    buf_t = tpu(buf)
    expected = f(x, buf)
    got = cf(tpu(x), buf_t)
    for g, e in zip(got, expected):
        assert_same(g, e)
    assert_same(buf_t, buf)


def test_returned_views_alias_what_they_view_as_on_cpu():
    """Outputs that view an input, or another output, come back as views of
    it: with symbolic sizes (AOTAutograd cannot rebuild a view whose offset is
    symbolic, so it keeps the backend's) and across a graph break."""
    def halves(x):
        return x[x.shape[0] // 2:], x.narrow(0, x.shape[0] - 2, 2), x.chunk(2)[-1]

    for dynamic in (False, True):
        torch._dynamo.reset()
        cf = torch.compile(halves, backend="tpu", dynamic=dynamic)
        for n in (8, 10):
            x = torch.arange(float(n))
            xt = tpu(x)
            got = cf(xt)
            for g, e in zip(got, halves(x)):
                assert_same(g, e)
            got[0].mul_(10)  # written through to the input, as on CPU
            x[n // 2:].mul_(10)
            assert_same(xt, x)

    def pair(x):
        y = x * 2
        return y, y[1:], y.view(2, -1).t()

    y, v, t = torch.compile(pair, backend="tpu")(tpu(torch.arange(6.)))
    v.mul_(100)
    t[0].zero_()
    ye, ve, te = pair(torch.arange(6.))
    ve.mul_(100)
    te[0].zero_()
    assert_same(y, ye)

    def across_break(x):
        y = x * 2
        v = y.t()
        torch._dynamo.graph_break()
        v[0].zero_()
        return y

    x = torch.arange(6.).view(3, 2)
    assert_same(torch.compile(across_break, backend="tpu")(tpu(x)), across_break(x))


def _check_outputs_and_aliasing(fn, make, dynamic, mutate=lambda outs: outs[0].add_(100)):
    """Runs `fn` compiled on tpu and on CPU with inputs from make(device),
    then mutates an output in both and compares outputs and inputs again:
    values and what aliases what must be as on CPU."""
    torch._dynamo.reset()
    xc, xt = make("cpu"), make("tpu")
    ec, gt = fn(*xc), torch.compile(fn, backend="tpu", dynamic=dynamic)(*xt)
    ec, gt = (ec if isinstance(ec, tuple) else (ec,)), (gt if isinstance(gt, tuple) else (gt,))
    for pair in ((ec, gt), (xc, xt)):
        for e, g in zip(*pair):
            assert_same(g, e)
    mutate(ec), mutate(gt)
    for pair in ((ec, gt), (xc, xt)):
        for e, g in zip(*pair):
            assert_same(g, e)


@pytest.mark.parametrize("dynamic", [False, True])
def test_views_of_a_mutated_input_alias_it_with_their_offsets(dynamic):
    """A returned view of an input the graph also writes comes back as that
    view of the input (offset and strides kept, also when symbolic), for
    contiguous, offset and column-stepped inputs."""
    def tail_mutated(x):
        b = x[x.shape[0] // 2:]
        b.add_(100)
        return b

    def narrow_mutated(x):
        v = x.narrow(0, 1, x.shape[0] - 1)
        v.mul_(3)
        return v

    def last_row_zeroed(x):
        v = x[-1:]
        v.zero_()
        return v

    flat = lambda d: (torch.arange(8.).to(d),)  # noqa: E731
    offset = lambda d: (torch.arange(12.).to(d)[2:10],)  # noqa: E731
    stepped = lambda d: (torch.arange(24.).reshape(4, 6).to(d)[:, ::2],)  # noqa: E731
    for fn in (tail_mutated, narrow_mutated, last_row_zeroed):
        for make in (flat, offset, stepped):
            _check_outputs_and_aliasing(fn, make, dynamic)


def test_views_of_offset_inputs_near_their_storage_end():
    """Views of an input that itself starts at an offset are rebuilt at the
    right offset (the input's own is counted once)."""
    _check_outputs_and_aliasing(lambda a: a.split([1, 2]), lambda d: (torch.arange(10.).to(d)[7:10],), False,
                                mutate=lambda outs: outs[1].mul_(-1))
    _check_outputs_and_aliasing(lambda a: a[1:, 1:], lambda d: (torch.arange(40.).reshape(5, 8).to(d)[2:5, 3:8],),
                                False)


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_viewing_one_intermediate_share_its_storage(dynamic):
    """Several outputs that view an intermediate not itself returned share
    its storage, as on CPU; also when the write comes after a graph break."""
    def views(a):
        y = a * 2
        return y[:3], y[2:], y.view(2, 3)

    _check_outputs_and_aliasing(views, lambda d: (torch.arange(6.).to(d),), dynamic,
                                mutate=lambda outs: outs[1].add_(100))

    def across_break(x):
        y = x * 2
        a, b = y[:2], y[1:]
        torch._dynamo.graph_break()
        a.zero_()
        return b

    _check_outputs_and_aliasing(across_break, lambda d: (torch.arange(4.).to(d),), dynamic)


def test_view_inputs_are_read_in_the_program():
    """A strided view passed to a graph is read from its storage by the
    program (no copy first); another geometry of the same shape gets its own
    program, and a dense input still works."""
    cf = torch.compile(lambda x: x * 2 + 1, backend="tpu")
    base = make((6, 8))
    b = tpu(base)
    assert_same(cf(b[1:5, ::2]), base[1:5, ::2] * 2 + 1)
    before = counters()
    with metrics_delta() as md:
        assert_same(cf(b[1:5, ::2]), base[1:5, ::2] * 2 + 1)
    assert md["executions"] == 1 and delta(before)["compiled_graphs"] == 0
    for view in (b[2:6, 1::2], b.t()[:4, :4], b[:4, :4].contiguous()):
        expected = view.cpu() * 2 + 1
        assert_same(cf(view), expected)


def test_a_one_element_view_input_compiles_once_for_any_storage_size():
    # A diffusers UNet gets t = timesteps[i], a 0-d view of a schedule whose
    # length is num_inference_steps: read in place, the program held for
    # that storage's size only (a recompile per step count). Copied out, one
    # program serves all; written in place, the write reaches the storage.
    def f(x, t):
        t.add_(1)
        return x * t
    cf = torch.compile(f, backend="tpu")
    x = make((2, 3))
    before = counters()
    for n in (4, 7, 20, 4):
        steps, ref = tpu(torch.linspace(9, 0, n)), torch.linspace(9, 0, n)
        for i in (0, n // 2, n - 1):
            assert_same(cf(tpu(x), steps[i]), f(x, ref[i]))
        assert_same(steps, ref)
    d = delta(before)
    assert d["compiled_graphs"] == 1 and d["graph_recompiles"] == 0, d


def test_graph_break_runs_rest_eagerly():
    def f(x):
        y = x.relu() * 2
        torch._dynamo.graph_break()
        return (y + 1).log()
    cf = torch.compile(f, backend="tpu")
    x = make((5, 6), low=0.1)
    before = counters()
    assert_same(cf(tpu(x)), f(x))
    assert delta(before)["dynamo_graphs"] == 2


def test_data_dependent_branch_breaks_graph():
    def f(x):
        if x.sum() > 0:  # a host read: Dynamo breaks the graph here
            return x * 2
        return x - 1
    cf = torch.compile(f, backend="tpu")
    for seed in (0, 1, 2):
        x = make((8,), seed=seed)
        assert_same(cf(tpu(x)), f(x))


def test_guards_recompile_on_python_value():
    def f(x, flag):
        return x + 1 if flag else x * 3
    cf = torch.compile(f, backend="tpu")
    x = make((4,))
    before = counters()
    assert_same(cf(tpu(x), True), f(x, True))
    assert_same(cf(tpu(x), False), f(x, False))
    assert_same(cf(tpu(x), True), f(x, True))
    d = delta(before)
    assert d["dynamo_graphs"] == 2 and d["dynamo_recompiles"] == 1


def test_backend_found_without_importing_dynamo_at_import():
    code = """
import sys, torch, torch_pjrt
assert "torch._dynamo" not in sys.modules  # import torch_pjrt stays light
f = torch.compile(lambda x: x * 2, backend="tpu")
print("OUT", f(torch.ones(2, device="tpu")).tolist(), torch_pjrt.metrics()["compiled_graphs"])
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OUT [2.0, 2.0] 1" in r.stdout


def test_dtype_change_recompiles_and_is_logged():
    code = """
import torch, torch_pjrt
f = torch.compile(lambda x: x * 2 + 1, backend="tpu", dynamic=False)
f(torch.ones(4, device="tpu"))
f(torch.ones(4, device="tpu", dtype=torch.float64))
f(torch.ones(6, device="tpu"))
m = torch_pjrt.metrics()
print("COUNTS", m["dynamo_recompiles"], m["compiled_graphs"])
"""
    r = run_python(code, TORCH_PJRT_LOG="recompiles")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "COUNTS 2 3" in r.stdout
    assert "dtype torch.float32 -> torch.float64" in r.stderr
    assert "shape (4) -> (6)" in r.stderr


def test_dynamic_none_follows_pytorch_default():
    """dynamic=None: the first shape compiles static; a second makes Dynamo
    trace the size as dynamic (one Dynamo recompile); the backend then builds
    one program per concrete length (logged with its cost)."""
    def f(x):
        return torch.cumsum(x, 1) * x.shape[1]
    cf = torch.compile(f, backend="tpu")
    before = counters()
    for n in (5, 7, 9, 7):
        x = make((2, n), seed=n)
        assert_same(cf(tpu(x)), f(x))
    d = delta(before)
    assert d["dynamo_recompiles"] == 1
    assert d["compiled_graphs"] == 3 and d["graph_recompiles"] == 1


def test_recompile_log_names_changed_input():
    code = """
import torch, torch_pjrt
f = torch.compile(lambda x: x.sum(1), backend="tpu")
for n in (3, 5, 8):
    f(torch.ones(2, n, device="tpu"))
"""
    r = run_python(code, TORCH_PJRT_LOG="recompiles")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "shape (2, 5) -> (2, 8)" in r.stderr and "cost" in r.stderr


def test_unlowerable_op_splits_graph_into_compiled_pieces():
    """An op with no lowering and no decomposition (linalg.svdvals: _linalg_svd)
    runs op by op (here on the CPU fallback) between compiled pieces; one warning."""
    def f(x, w):
        y = (x @ w).relu()
        d = torch.linalg.svdvals(y[:, :3, :3]).sum(-1)
        return (y * d[:, None, None]).sum(-1) + 1
    cf = torch.compile(f, backend="tpu")
    x, w = make((2, 3, 4)), make((4, 4), seed=1)
    before = counters()
    with warnings.catch_warnings(record=True) as w_:
        warnings.simplefilter("always")
        out = cf(*tpu((x, w)))
        cf(*tpu((x, w)))
    assert_same(out, f(x, w), rtol=1e-4, atol=1e-4)
    msgs = [str(m.message) for m in w_ if "cannot lower" in str(m.message)]
    assert len(msgs) == 1 and "svd" in msgs[0] and "pieces" in msgs[0]
    d = delta(before)
    assert torch_pjrt.metrics()["partitioned_graphs"] >= 1
    assert d["compiled_graphs"] == 2 and d["compiled_graph_runs"] == 4 and d["eager_graph_fallbacks"] == 0


def test_graph_of_only_unlowerable_ops_runs_eagerly():
    cf = torch.compile(lambda x: torch.linalg.svdvals(x), backend="tpu")
    x = make((3, 3))
    before = counters()
    assert_same(cf(tpu(x)), torch.linalg.svdvals(x), rtol=1e-4, atol=1e-4)
    assert delta(before)["eager_graph_fallbacks"] == 1


def test_bad_shapes_raise_like_cpu():
    cf = torch.compile(lambda a, b: a @ b, backend="tpu")
    with pytest.raises(RuntimeError):
        torch.ones(2, 3) @ torch.ones(4, 5)
    with pytest.raises(RuntimeError, match="same reduction dim"):
        cf(torch.ones(2, 3, device="tpu"), torch.ones(4, 5, device="tpu"))


def test_factory_graphs_run_on_the_traced_device():
    f = torch.compile(lambda n: torch.arange(4, device="tpu:1") * n, backend="tpu")
    r = f(3)
    assert r.device == torch.device("tpu:1") and r.cpu().tolist() == [0, 3, 6, 9]
    g = torch.compile(lambda: torch.full((2, 3), 1.5, device="tpu") + 1, backend="tpu")
    assert_same(g(), torch.full((2, 3), 2.5))
    h = torch.compile(lambda x: (x.cpu() * 2, x + 1), backend="tpu")  # a CPU output
    a, b = h(tpu(make((3,))))
    assert a.device.type == "cpu" and torch.equal(a, make((3,)) * 2)
    assert_same(b, make((3,)) + 1)


def test_inputs_on_two_devices_raise():
    cf = torch.compile(lambda a, b: a + b, backend="tpu")
    with pytest.raises(RuntimeError, match="tpu"):
        cf(torch.ones(3, device="tpu:0"), torch.ones(3, device="tpu:1"))


def test_random_ops_in_graph_draw_fresh_bits():
    cf = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
    x = torch.ones(4000, device="tpu")
    torch.manual_seed(0)
    a, b = cf(x).cpu(), cf(x).cpu()
    assert not torch.equal(a, b)
    for y in (a, b):
        kept = (y != 0).float().mean().item()
        assert 0.45 < kept < 0.55
        assert set(y.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(0)
    assert torch.equal(cf(x).cpu(), a)  # seeded like eager


def test_bucketing_compiles_once_per_bucket():
    model, _, batch, _ = models.build("gpt")
    model.eval()
    idx, _ = batch(0)
    m = copy.deepcopy(model).to("tpu")
    bm = torch_pjrt.bucketed(torch.compile(m, backend="tpu"), dims={"idx": 1}, sizes=[8, 16])
    before = counters()
    with torch.no_grad():
        for n in (3, 5, 8, 9, 12, 16):
            out = bm(tpu(idx[:, :n]))
            assert out.shape == (8, n, 64)
            assert_same(out, model(idx[:, :n]), rtol=1e-4, atol=1e-5)
    assert delta(before)["compiled_graphs"] == 2


def test_bucketing_on_the_host_compiles_nothing_per_length():
    """Token ids padded on the host, then moved: after one call per bucket,
    new lengths compile no program at all."""
    model, _, batch, _ = models.build("gpt")
    model.eval()
    idx, _ = batch(0)
    m = copy.deepcopy(model).to("tpu")
    # dynamic=False: one static graph per bucket (with dynamic=None the second
    # bucket makes Dynamo trace a dynamic graph, which then compiles the
    # first bucket's shape once more)
    cm = torch.compile(m, backend="tpu", dynamic=False)
    bm = torch_pjrt.bucketed(cm, dims={"idx": 1}, sizes=[8, 16], device="tpu")
    with torch.no_grad():
        bm(idx[:, :8]), bm(idx[:, :16])  # one per bucket
        with metrics_delta() as md:
            outs = {n: bm(idx[:, :n]) for n in (3, 5, 9, 13)}  # CPU ids
            torch.tpu.synchronize()
        for n, out in outs.items():
            assert out.device.type == "tpu" and out.shape == (8, n, 64)
            assert_same(out, model(idx[:, :n]), rtol=1e-4, atol=1e-5)
    assert md["xla_compiles"] == 0 and md["persistent_cache_hits"] == 0 and md["compiled_graphs"] == 0


def test_bucketing_rejects_unknown_argument():
    with pytest.raises(ValueError, match="not among the arguments"):
        torch_pjrt.bucketed(lambda x: x, dims={"y": 0}, sizes=[4])
    assert torch_pjrt.next_bucket(5, [8, 4, 16]) == 8 and torch_pjrt.next_bucket(20, [8, 16]) == 20


# ---- models: compiled == eager on tpu == PyTorch on CPU ------------------------------------------

@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_model_outputs_and_gradients(kind):
    model, _, batch, loss_fn = models.build(kind)
    x, y = batch(0)
    cpu_model = copy.deepcopy(model)
    eager = copy.deepcopy(model).to("tpu")
    compiled_model = copy.deepcopy(model).to("tpu")
    cm = torch.compile(compiled_model, backend="tpu")
    losses = {}
    for name, m, fn, dev in (("cpu", cpu_model, cpu_model, "cpu"), ("eager", eager, eager, "tpu"),
                             ("compiled", compiled_model, cm, "tpu")):
        loss = loss_fn(fn, x.to(dev), y.to(dev))
        loss.backward()
        losses[name] = loss
    assert_same(losses["compiled"], losses["cpu"], rtol=1e-5, atol=1e-5)
    assert_same(losses["compiled"], losses["eager"].cpu(), rtol=1e-5, atol=1e-5)
    for (n, p_c), p_e, p_cpu in zip(compiled_model.named_parameters(), eager.parameters(), cpu_model.parameters()):
        assert_same(p_c.grad, p_cpu.grad, rtol=1e-4, atol=1e-5)
        assert_same(p_c.grad, p_e.grad.cpu(), rtol=1e-4, atol=1e-5)
    for (_, b_c), (_, b_cpu) in zip(compiled_model.named_buffers(), cpu_model.named_buffers()):
        assert_same(b_c, b_cpu, rtol=1e-5, atol=1e-6)  # batch norm running stats


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_model_inference(kind, mode):
    model, _, batch, _ = models.build(kind)
    model.eval()
    x, _ = batch(0)
    cm = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with ctx():
        assert_same(cm(tpu(x)), model(x), rtol=1e-4, atol=1e-5)


def copies_with_grads(model, batch, loss_fn):
    """The model on cpu, and twice on tpu ("eager", "compiled"), each holding
    the gradients of one CPU backward."""
    x, y = batch(0)
    loss_fn(model, x, y).backward()
    copies = {name: copy.deepcopy(model).to(dev) for name, dev in
              (("cpu", "cpu"), ("eager", "tpu"), ("compiled", "tpu"))}
    for m in copies.values():
        for p, src in zip(m.parameters(), model.parameters()):
            p.grad = src.grad.to(p.device)
    return copies


def assert_parameters_agree(copies):
    for p_c, p_e, p_cpu in zip(*(copies[n].parameters() for n in ("compiled", "eager", "cpu"))):
        assert_same(p_c, p_e.cpu(), rtol=1e-5, atol=1e-6)
        assert_same(p_c, p_cpu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_compiled_optimizer_step_matches_eager(kind):
    model, make_opt, batch, loss_fn = models.build(kind)
    copies = copies_with_grads(model, batch, loss_fn)
    opts = {name: make_opt(m.parameters()) for name, m in copies.items()}

    def update(name):
        def fn():  # gradient clipping and the step: one graph when compiled
            torch.nn.utils.clip_grad_norm_(copies[name].parameters(), 0.5)
            opts[name].step()
        return fn
    steps = {"cpu": update("cpu"), "eager": update("eager"),
             "compiled": torch.compile(update("compiled"), backend="tpu")}
    before = counters()
    for _ in range(3):
        for s in steps.values():
            s()
    assert delta(before)["eager_graph_fallbacks"] == 0
    assert_parameters_agree(copies)


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_compiled_training_loop_follows_cpu(kind):
    """Forward, backward and optimizer step compiled; 8 steps track CPU,
    and after the first steps nothing compiles any more."""
    model, make_opt, batch, loss_fn = models.build(kind)
    cpu_model, tpu_model = copy.deepcopy(model), copy.deepcopy(model).to("tpu")
    opt_cpu, opt_tpu = make_opt(cpu_model.parameters()), make_opt(tpu_model.parameters())
    cm = torch.compile(tpu_model, backend="tpu")
    step = torch.compile(opt_tpu.step, backend="tpu")
    md = metrics_delta().__enter__()
    for s in range(8):
        if s == 2:
            # (SGD's momentum buffers exist from the second step on: its
            # graph is captured again then, as with any backend.)
            before = counters()
        x, y = batch(s)
        for m, fn, opt, st, dev in ((cpu_model, cpu_model, opt_cpu, opt_cpu.step, "cpu"),
                                    (tpu_model, cm, opt_tpu, step, "tpu")):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(fn, x.to(dev), y.to(dev))
            loss.backward()
            st()
            if dev == "cpu":
                ref = loss.item()
            else:
                assert abs(loss.item() - ref) <= 1e-4 * max(1.0, abs(ref)), (s, loss.item(), ref)
    md.__exit__()
    d = delta(before)
    # forward, backward and the optimizer step: all compiled by then
    assert d["compiled_graphs"] == 0 and d["compiled_graph_runs"] == 6 * 3 and d["eager_graph_fallbacks"] == 0
    assert md["cpu_fallbacks"] == {}


def test_second_process_loads_compiled_graphs_from_the_persistent_cache(tmp_path):
    code = """
import json, torch, torch_pjrt
from examples import models
model, make_opt, batch, loss_fn = models.build("gpt")
m = model.to("tpu"); opt = make_opt(m.parameters())
cm, step = torch.compile(m, backend="tpu"), torch.compile(opt.step, backend="tpu")
x, y = batch(0)
loss = loss_fn(cm, x.to("tpu"), y.to("tpu")); loss.backward(); step()
out = {"loss": loss.item(), "w": m.head.weight[0, :4].tolist()}
out.update({k: v for k, v in torch_pjrt.metrics().items() if not isinstance(v, dict)})
print("RESULT", json.dumps(out))
"""
    runs = []
    for _ in range(2):
        r = run_python(code, TORCH_PJRT_CACHE_DIR=str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(__import__("json").loads(r.stdout.split("RESULT", 1)[1]))
    cold, warm = runs
    assert cold["xla_compiles"] > 0 and cold["compiled_graphs"] >= 3
    assert warm["xla_compiles"] == 0 and warm["persistent_cache_hits"] >= warm["compiled_graphs"] >= 3
    assert warm["loss"] == cold["loss"] and warm["w"] == cold["w"]


def test_dropout_training_matches_eager_tpu():
    """Random ops in compiled forward graphs draw keys in eager's order, and
    backward uses the forward's mask: losses equal eager's on tpu."""
    cfg = models.GPTConfig(dropout=0.1)
    text = models.gpt_text()
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        m = models.GPT(cfg).to("tpu")
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        f = torch.compile(m, backend="tpu") if compiled else m
        losses = []
        for s in range(12):
            x, y = models.gpt_batch(s, text=text)
            opt.zero_grad()
            loss = f(x.to("tpu"), y.to("tpu"))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append(losses)
    assert runs[1] == pytest.approx(runs[0], rel=1e-5, abs=1e-5)
    assert runs[0][0] != pytest.approx(runs[0][1])  # (training moves)


def test_autocast_inside_compiled_function():
    def f(a, b):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return (a @ b).float().softmax(-1)
    a, b = make((8, 16)), make((16, 4), seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = (a @ b).float().softmax(-1)
    assert_same(torch.compile(f, backend="tpu")(*tpu((a, b))), expected, rtol=1e-5, atol=1e-6)


def test_dynamic_true_compiles_per_concrete_size():
    g = torch.compile(lambda x: (x * x).sum(0), backend="tpu", dynamic=True)
    before = counters()
    for n in (3, 4, 5, 4):
        x = make((n, 2), seed=n)
        assert_same(g(tpu(x)), (x * x).sum(0))
    d = delta(before)
    assert d["dynamo_graphs"] == 1 and d["compiled_graphs"] == 3


class _Counter:
    def __init__(self):
        self.n = 0


def test_an_int_only_the_host_reads_compiles_one_program():
    # A Python int attribute Dynamo makes a SymInt input after its first
    # recompile (transformers' sliding-window StaticCache counts its length
    # so): read only by `n + 1`, which the host computes, it keeps one
    # executable for every value instead of one per decoded token.
    def step(x, c):
        c.n += 1
        return x * 2 + 1, c.n * 3
    f = torch.compile(step, backend="tpu")
    x, c = make((4,)), _Counter()
    before = counters()
    for i in range(1, 13):
        y, k = f(tpu(x), c)
        assert_same(y, x * 2 + 1)
        assert k == 3 * i and c.n == i
    d = delta(before)
    assert d["dynamo_graphs"] == 2 and d["compiled_graphs"] == 2 and d["graph_recompiles"] == 0


@pytest.mark.parametrize("use", ["value", "shape", "returned"])
def test_an_int_the_program_reads_keeps_its_value(use):
    # The same counter read by the device program (as a tensor value or a
    # size) or returned as it is: each value is a program of its own, and
    # right.
    def step(x, c):
        c.n += 1
        if use == "value":
            return x * c.n
        if use == "shape":
            return x.sum() + torch.ones(c.n, device=x.device).sum()
        return x + 1, c.n
    f = torch.compile(step, backend="tpu")
    x, c = make((4,)), _Counter()
    for i in range(1, 6):
        out = f(tpu(x), c)
        want = x * i if use == "value" else x.sum() + i if use == "shape" else (x + 1, i)
        assert_same(out, want)


def test_a_python_float_from_a_dynamic_size_stays_in_the_program():
    # AOTAutograd turns `2.0 / n` (n a symbolic size) into a tensor op after
    # its own decomposition: aten.true_divide, composite, which the walk
    # decomposes instead of cutting the graph (GPT-2, GPT-J, ALBERT, UNet's
    # attention scale under dynamic=True).
    g = torch.compile(lambda x: x * (2.0 / x.shape[-1]), backend="tpu", dynamic=True)
    before = counters()
    for n in (10, 7):
        x = make((4, n), seed=n)
        assert_same(g(tpu(x)), x * (2.0 / n))
    d = delta(before)
    assert d["partitioned_graphs"] == 0 and d["eager_graph_fallbacks"] == 0 and d["compiled_graphs"] >= 1


@pytest.mark.parametrize("kwargs", [{"foreach": False}, {"foreach": True, "capturable": True}, {"fused": True}],
                         ids=["for-loop", "capturable", "fused"])
def test_optimizer_variants_compiled_and_eager_match_cpu(kwargs):
    """AdamW's other code paths: per-tensor loop, capturable (step counts on
    the device: _foreach_pow(Scalar, Tensor[])), fused (Dynamo runs it as is)."""
    model, _, batch, loss_fn = models.build("gpt")
    copies = copies_with_grads(model, batch, loss_fn)
    opts = {n: torch.optim.AdamW(m.parameters(), lr=3e-3, **(kwargs if n != "cpu" else
                                                              {k: v for k, v in kwargs.items() if k != "capturable"}))
            for n, m in copies.items()}
    step = torch.compile(opts["compiled"].step, backend="tpu")
    before = counters()
    for _ in range(3):
        opts["cpu"].step()
        opts["eager"].step()
        step()
    assert delta(before)["eager_graph_fallbacks"] == 0
    assert_parameters_agree(copies)


def test_dynamic_batch_after_static_steps_gpt_training():
    # A GPT train step compiled at batch 1, then batch 2: Dynamo traces a
    # dynamic graph whose saved views (split qkv) must come back with this
    # call's concrete sizes (symbolic ones broke as_strided).
    torch.manual_seed(0)
    model = models.GPT().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fwd, step = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
    text = models.gpt_text()
    losses = []
    for bs in (1, 1, 1, 2, 2, 4):
        x, y = models.gpt_batch(0, batch=bs, text=text)
        opt.zero_grad(set_to_none=True)
        loss = fwd(x.to("tpu"), y.to("tpu"))
        loss.backward()
        step()
        losses.append(loss.item())
    assert all(math.isfinite(l) for l in losses) and losses[2] < losses[0]


def test_grouped_mm_float32_compiles_and_matches_cpu():
    """torch._grouped_mm in float32 (transformers' Mixture-of-Experts layers on
    tpu): PyTorch's Meta kernel accepts bfloat16 only, which failed Dynamo's
    FakeTensor propagation; torch_pjrt/_grouped_mm_meta.py lets the dtypes its
    eager kernels take through. Values against CPU's kernel, rtol/atol 1e-5."""
    a, w = make((6, 8)), make((4, 8, 12), seed=1)
    offs = torch.tensor([2, 3, 3, 6], dtype=torch.int32)

    def f(a, w, offs):
        return torch._grouped_mm(a, w, offs=offs).relu()

    expected = f(a, w, offs)
    out = torch.compile(f, backend="tpu", fullgraph=True)(tpu(a), tpu(w), tpu(offs))
    assert_same(out, expected)
    with pytest.raises(RuntimeError, match="contraction dimension"):  # the Meta kernel's other checks stay
        torch.compile(f, backend="tpu", fullgraph=True)(tpu(a), tpu(make((4, 6, 12))), tpu(offs))


def test_tensor_constants_are_program_inputs_not_graph_cuts():
    # torch.tensor(...) inside a compiled function is a graph constant (a
    # get_attr node): it becomes an input of the one program instead of
    # cutting the graph into pieces around it.
    def f(x):
        on_device = torch.tensor([2.0, 3.0], device=x.device)
        on_cpu = torch.tensor([1.5, -2.0, 3.0])
        return (x * on_device).sum(0) + on_cpu.to(x.device)[:2]

    x = torch.randn(4, 2)
    before = torch_pjrt.metrics()
    cf = torch.compile(f, backend="tpu", fullgraph=True)
    for scale in (1.0, 2.0):
        assert_same(cf(tpu(x * scale)), f(x * scale))
    after = torch_pjrt.metrics()
    assert after["partitioned_graphs"] == before["partitioned_graphs"]
    assert after["eager_graph_fallbacks"] == before["eager_graph_fallbacks"]
    assert after["compiled_graph_runs"] - before["compiled_graph_runs"] == 2


def test_dynamo_device_interface_is_torch_pjrts():
    # torch 2.13 registers its own "tpu" interface (for another package), whose
    # device_count / synchronize / current_stream raise NotImplementedError.
    from torch._dynamo.device_interface import get_interface_for_device
    for name in ("tpu", "tpu:1"):
        iface = get_interface_for_device(name)
        assert iface.device_count() == torch.tpu.device_count()
        assert iface.is_available() and iface.current_device() == 0
        assert iface.current_stream() == torch.tpu.current_stream()
        assert iface.memory_allocated() == torch.tpu.memory_allocated()
        assert iface.is_dtype_supported(torch.float16) and iface.is_dtype_supported(torch.float64)
        assert not iface.is_dtype_supported(torch.complex32)
        iface.synchronize()
    assert get_interface_for_device("cpu").__name__ == "CpuInterface"  # the built-in ones stay
    # Dynamo imported before torch_pjrt, and torch_pjrt before Dynamo.
    for first, second in (("torch._dynamo", "torch_pjrt"), ("torch_pjrt", "torch._dynamo")):
        out = run_json(f"import json, torch, {first}, {second}\n"
                       "from torch._dynamo.device_interface import get_interface_for_device as get\n"
                       "print('RESULT ' + json.dumps(get('tpu').device_count()))")
        assert out == torch.tpu.device_count()


def _fill_diagonal(x):
    y = x * 2
    y.diagonal().fill_(1)
    return y


def _scale_strided_window(x):
    y = x * 2
    y.as_strided((2, 2), (1, 4)).mul_(3)
    return y


def _fill_offset_diagonal_of_transpose(x):
    y = (x * 2).t()
    y.diagonal(1).fill_(7)
    return y


@pytest.mark.parametrize("f", [
    _fill_diagonal, _scale_strided_window, _fill_offset_diagonal_of_transpose,
    lambda x: torch.diagonal_scatter(x * 1, torch.ones(3, device=x.device), -1),
    lambda x: torch.as_strided_scatter(x + 1, torch.zeros(2, 3, device=x.device), (2, 3), (1, 4), 2),
    lambda x: torch.diagonal_scatter(torch.zeros(3, 4, 4, device=x.device), x[:3], 0, 1, 2),
])
def test_writes_into_diagonals_and_strided_windows_compile_whole(f):
    """diagonal_scatter and as_strided_scatter (what functionalization makes
    of a write into a diagonal or as_strided view) are one graph: PyTorch's
    decompositions of them write into a view, which cut the graph into pieces
    run op by op."""
    x = torch.randn(4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu")(x.to("tpu"))
    expected = f(x)
    assert not [w for w in caught if "torch_pjrt" in str(w.message)], [str(w.message) for w in caught]
    assert got.stride() == expected.stride()
    assert_same(got, expected)


def test_flex_attention_compiles_whole_with_its_backward():
    """torch.compile(flex_attention) with a score_mod reading a bias tensor, a
    causal block mask and grouped-query heads: the flex_attention
    higher-order ops (forward and backward) are traced through PyTorch's
    dense implementation into the graph (they cut it into pieces run op by
    op). Against the same attention written out on CPU."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    torch.manual_seed(0)
    q, k, v, bias = torch.randn(2, 4, 64, 16), torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16), torch.randn(64, 64)
    qc, kc, vc = [t.clone().requires_grad_() for t in (q, k, v)]
    scores = qc @ kc.repeat_interleave(2, 1).transpose(-1, -2) / 4 + bias
    scores = scores.masked_fill(~torch.ones(64, 64, dtype=torch.bool).tril(), float("-inf"))
    lse_r, out_r = torch.logsumexp(scores, -1), torch.softmax(scores, -1) @ vc.repeat_interleave(2, 1)
    (out_r.pow(2).sum() + lse_r.sum()).backward()

    bias_t = bias.to("tpu")
    qt, kt, vt = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    mask = create_block_mask(lambda b, h, i, j: i >= j, 2, 1, 64, 64, device="tpu")
    partitioned = torch_pjrt.metrics()["partitioned_graphs"]
    before = counters()
    out, lse = torch.compile(flex_attention, backend="tpu")(
        qt, kt, vt, score_mod=lambda s, b, h, i, j: s + bias_t[i, j], block_mask=mask, enable_gqa=True,
        return_lse=True)
    (out.pow(2).sum() + lse.sum()).backward()
    assert delta(before)["compiled_graphs"] == 2  # forward and backward
    assert torch_pjrt.metrics()["partitioned_graphs"] == partitioned
    for got, expected in [(out, out_r), (lse, lse_r), (qt.grad, qc.grad), (kt.grad, kc.grad), (vt.grad, vc.grad)]:
        torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("f", [
    lambda t: t[0, 0].t().to("cpu"),
    lambda t: t.permute(0, 2, 3, 1).to("cpu") * 2,
    lambda t: t.to("cpu", torch.float64, memory_format=torch.channels_last),
    lambda t: (t + 1).transpose(-1, -2).cpu(),
])
def test_a_graph_output_made_on_the_cpu_keeps_its_strides(f):
    """A compiled function returning a tensor moved to the CPU in a strided
    layout (a transpose, channels_last): the program lays the values out in
    that layout and the CPU tensor has its strides (it had contiguous ones:
    the values came back scrambled)."""
    x = torch.arange(24.0).reshape(2, 3, 2, 2)
    got, expected = torch.compile(f, backend="tpu")(x.to("tpu")), f(x)
    assert got.device.type == "cpu" and got.dtype == expected.dtype and got.stride() == expected.stride()
    assert torch.equal(got, expected)


def test_native_batch_norm_with_out_compiles_and_updates_the_running_stats():
    """torch.native_batch_norm(..., out=) compiled: on tpu its composite makes
    _native_batch_norm_legit (which writes the running stats) below
    AOTAutograd's functionalization; its lowering kept it from being
    decomposed, and AOTAutograd refused the graph. Outputs and running
    stats against CPU."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)

    def f(x, w, b, rm, rv, out):
        return torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, out=out)

    def run(device, fn):
        out = tuple(torch.zeros(s, device=device) for s in [(3, 2, 4), (2,), (2,)])
        rm, rv = torch.zeros(2, device=device), torch.ones(2, device=device)
        fn(x.to(device), w.to(device), b.to(device), rm, rv, out)
        return [t.cpu() for t in (*out, rm, rv)]

    for got, expected in zip(run("tpu", torch.compile(f, backend="tpu")), run("cpu", f)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("f,view", [
    (lambda t: torch.as_strided(t, (2, 2), (1, 2)) + 0, lambda b: b[::2]),
    (lambda t: torch.as_strided_copy(t, (3,), (3,)) * 2, lambda b: b[::2]),
    (lambda t: torch.as_strided(t, (4,), (1,)) + 1, lambda b: b[4:6]),
    (lambda t: torch.as_strided(t, (3,), (2,)) * 3, lambda b: b[5]),  # one element: in place too
])
def test_as_strided_of_a_view_input_reads_its_storage(f, view):
    """as_strided of an input that is a view may read storage elements outside
    the view (PyTorch allows any position in the storage): the program reads
    them from the storage (they came back as zeros, or read beside the view)."""
    base = torch.arange(10.0)
    b = base.to("tpu")
    got, expected = torch.compile(f, backend="tpu")(view(b)), f(view(base))
    assert_same(got, expected)


@pytest.mark.parametrize("device,backend", [("tpu", "tpu"), ("cpu", "aot_eager")])
def test_rng_state_functions_inside_compiled_code(device, backend):
    """torch.testing's freeze_rng_state (OpInfo's wrapper_set_seed) calls the
    accelerator's get/set_rng_state under no_dispatch: Dynamo traced into
    torch.tpu's and failed, on CPU tensors too once torch_pjrt is imported.
    They run on the host now (a graph break, as around torch.cuda's)."""
    from torch.testing._utils import freeze_rng_state

    def f(x):
        with freeze_rng_state():
            return F.dropout(x, 0.5)

    x = torch.randn(64, device=device)
    run = torch.compile(f, backend=backend)
    first, second = run(x), run(x)
    assert torch.equal(first.cpu(), second.cpu())  # the state was restored after each call
    state = torch.compile(lambda t: (t * 2, torch.tpu.get_rng_state()), backend="tpu")(x.to("tpu"))[1]
    assert torch.equal(state, torch.tpu.get_rng_state())


def test_bilinear_and_empty_permuted_compile_whole():
    """F.bilinear (aten._trilinear in graphs) and torch.empty_permuted have
    lowerings: they cut compiled graphs into pieces."""
    torch.manual_seed(0)
    x1, x2, w, b = torch.randn(3, 4), torch.randn(3, 5), torch.randn(6, 4, 5), torch.randn(6)

    def f(x1, x2, w, b):
        return F.bilinear(x1, x2, w, b) + torch.empty_permuted((3, 6), (1, 0), device=x1.device).fill_(1)

    partitioned = torch_pjrt.metrics()["partitioned_graphs"]
    ins = [t.to("tpu").requires_grad_() for t in (x1, x2, w, b)]
    got = torch.compile(f, backend="tpu")(*ins)
    got.sum().backward()
    ref = [t.clone().requires_grad_() for t in (x1, x2, w, b)]
    expected = f(*ref)
    expected.sum().backward()
    assert torch_pjrt.metrics()["partitioned_graphs"] == partitioned
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    for g, e in zip(ins, ref):
        torch.testing.assert_close(g.grad.cpu(), e.grad, rtol=1e-5, atol=1e-5)


def test_compile_modes_and_options():
    """mode= values Inductor knows compile the same program; an unknown mode
    raises (as Inductor's check does); options= (Inductor's settings) are
    named in a warning, not dropped silently."""
    import warnings
    x = torch.arange(4.0)
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "default"):
        torch._dynamo.reset()
        assert_same(torch.compile(lambda a: a * 2 + 1, backend="tpu", mode=mode)(x.to("tpu")), x * 2 + 1)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode=no-such-mode"):
        torch.compile(lambda a: a * 2, backend="tpu", mode="no-such-mode")(x.to("tpu"))
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same(torch.compile(lambda a: a - 1, backend="tpu", options={"a_typo_option": 1})(x.to("tpu")), x - 1)
    assert any("a_typo_option" in str(w.message) for w in caught)


def _scatter_then_as_strided(x, src):
    y = torch.slice_scatter(x.transpose(1, 2), src, 2, 0, 2)  # keeps the input's strides (24, 1, 6)
    return y.as_strided((2, 6), (24, 1))  # the first 6 elements of each batch in memory order


def _setitem_then_as_strided(x, src):
    y = x.transpose(1, 2).clone()
    y[:, :, 1:3].mul_(10.0)  # functionalized to a slice_scatter
    return y.as_strided((2, 6), (24, 1))


def _scatter_then_view(x, src):
    return torch.slice_scatter(x.transpose(1, 2), src, 2, 0, 2).transpose(1, 2).view(8, 6)


@pytest.mark.parametrize("fn", [_scatter_then_as_strided, _setitem_then_as_strided, _scatter_then_view])
def test_decomposed_ops_keep_their_own_layout(fn):
    """slice_scatter, lowered through its decomposition, keeps its input's
    strides as eager does: the value took the decomposition's last op's
    (contiguous) layout, so a later as_strided read other elements
    ([-1, -1, 12, 18, ...] for [-1] * 6) and a valid view split the graph."""
    x = torch.arange(48.0).reshape(2, 4, 6)
    src = torch.full((2, 6, 2), -1.0)
    torch._dynamo.reset()
    before = torch_pjrt.metrics()["partitioned_graphs"]
    assert_same(torch.compile(fn, backend="tpu")(x.to("tpu"), src.to("tpu")), fn(x, src))
    assert torch_pjrt.metrics()["partitioned_graphs"] == before
