"""torch_pjrt.capture_step: a whole step recorded under fused eager and
replayed as one XLA program. Every replayed result is compared with the same
step run by PyTorch on CPU (float32: rtol/atol 1e-5 per step, as in
tests/test_training.py); replays that cannot be exact must fall back to
running the step, never return stale values."""
import gc
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = ATOL = 1e-5


def _model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 4))


def _batches(n, rows=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 16, generator=g), torch.randn(rows, 4, generator=g)) for _ in range(n)]


def _train_step(model, opt, clip=1.0, forward=None):
    """zero_grad, MSE loss of `forward` (default: the model), backward, clip, step."""
    params = list(model.parameters())
    forward = forward or model

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        return loss
    return step


def _pair(capturable=True, opt_cls=torch.optim.AdamW, **opt_kw):
    """(cpu model, cpu step, tpu model, tpu step): the same weights and recipe."""
    ref, dev = _model(), _model().to("tpu")
    opt_r = opt_cls(ref.parameters(), lr=1e-2, **opt_kw)
    kw = dict(opt_kw, capturable=True) if capturable else opt_kw
    opt_d = opt_cls(dev.parameters(), lr=1e-2, **kw)
    return ref, _train_step(ref, opt_r), dev, _train_step(dev, opt_d)


def _delta(before, key):
    return torch_pjrt.metrics()[key] - before[key]


def test_training_step_replays_one_program_and_matches_cpu():
    ref, step_r, dev, step_d = _pair()
    captured = torch_pjrt.capture_step(step_d)
    for i, (x, y) in enumerate(_batches(10)):
        m0 = torch_pjrt.metrics()
        loss = captured(x.to("tpu"), y.to("tpu"))
        if i >= 3:  # warm-up, two recordings, then replays
            assert _delta(m0, "capture_replays") == 1
            assert _delta(m0, "executions") == 1, "a replayed step is one execution"
            assert loss.grad_fn is None
        torch.testing.assert_close(loss.cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
        for p, q in zip(ref.parameters(), dev.parameters()):
            torch.testing.assert_close(q.cpu(), p.detach(), rtol=RTOL, atol=ATOL)
    assert captured.replayable(x.to("tpu"), y.to("tpu")) == (True, None)
    for p, q in zip(ref.parameters(), dev.parameters()):  # gradients are visible after a replay
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=RTOL, atol=ATOL)


def test_sgd_momentum_and_decorator_form():
    ref, dev = _model(), _model().to("tpu")
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    step_r = _train_step(ref, opt_r)

    @torch_pjrt.capture_step(warmup=0)
    def step_d(x, y):
        return _train_step(dev, opt_d)(x, y)

    for x, y in _batches(8):
        torch.testing.assert_close(step_d(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    assert torch_pjrt.metrics()["capture_replays"] > 0
    for p, q in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=RTOL, atol=ATOL)


def test_donation_never_corrupts_and_memory_stays_flat():
    ref, step_r, dev, step_d = _pair()
    captured = torch_pjrt.capture_step(step_d)
    batches = _batches(12)
    kept_view = next(dev.parameters())[0]  # a view of a parameter the step donates
    allocated = []
    for i, (x, y) in enumerate(batches):
        old = next(dev.parameters()).detach().clone()
        captured(x.to("tpu"), y.to("tpu"))
        step_r(x, y)
        torch.testing.assert_close(kept_view.cpu(), next(ref.parameters())[0].detach(), rtol=RTOL, atol=ATOL)
        assert not torch.equal(old.cpu(), next(dev.parameters()).detach().cpu())  # the clone kept the old value
        del old
        gc.collect()  # (cyclic garbage of earlier tests in this worker, freed at a random call otherwise)
        torch.tpu.synchronize()
        allocated.append(torch.tpu.memory_allocated())
    assert torch_pjrt.metrics()["fused_donated_buffers"] > 0
    assert len(set(allocated[5:])) == 1, f"device memory grows across replays: {allocated}"


def test_dropout_draws_new_random_keys_each_replay():
    def run(capture):
        torch.manual_seed(0)
        model = _model(dropout=0.5).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = _train_step(model, opt)
        if capture:
            step = torch_pjrt.capture_step(step)
        torch.manual_seed(123)
        return [step(x.to("tpu"), y.to("tpu")).item() for x, y in _batches(8)]

    eager, replayed = run(False), run(True)
    assert torch_pjrt.metrics()["capture_replays"] > 0
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=RTOL, atol=ATOL)
    assert len(set(replayed)) == len(replayed)


def test_optimizer_step_count_on_cpu_is_not_replayed():
    ref, step_r, dev, step_d = _pair(capturable=False)
    captured = torch_pjrt.capture_step(step_d)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x, y in _batches(6):
            torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    ok, why = captured.replayable(x.to("tpu"), y.to("tpu"))
    assert ok is False and "capturable=True" in why
    assert any("capturable=True" in str(x.message) for x in w)
    for p, q in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=RTOL, atol=ATOL)


def test_host_read_inside_the_step_is_not_replayed():
    ref, step_r, dev, step_d = _pair()
    seen = []

    def step(x, y):
        loss = step_d(x, y)
        seen.append(loss.item())  # a host read in the middle of the recorded region
        return loss

    captured = torch_pjrt.capture_step(step)
    with pytest.warns(RuntimeWarning, match="reads a tpu tensor's value on the host"):
        for x, y in _batches(5):
            torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y),
                                       rtol=RTOL, atol=ATOL)
    assert len(seen) == 5  # the Python ran every time


@pytest.mark.parametrize("read", ["int", "item", "tolist"])
def test_a_host_read_of_a_ready_value_is_not_baked_into_replays(read):
    """A host read that needs no flush (the value is already on the device)
    still makes the step unreplayable: a replay would reuse the value read
    while recording (here, the same first element in every recording)."""
    how = {"int": lambda t: int(t[0]), "item": lambda t: t[0].item(), "tolist": lambda t: t.tolist()[0]}[read]

    def f(x):
        return x + how(x)

    captured = torch_pjrt.capture_step(f)
    with pytest.warns(RuntimeWarning, match="reads a tpu tensor's value on the host"):
        for v in ([1, 2], [1, 3], [1, 4], [1, 5], [7, 6], [9, 1]):
            x = torch.tensor(v)
            assert torch.equal(captured(x.to("tpu")).cpu(), f(x))
    assert captured.replayable(x.to("tpu"))[0] is False


def test_a_cpu_tensor_written_in_the_step_is_not_replayed():
    """Adagrad keeps its step count on the CPU (no capturable option), and a
    plain CPU counter: a replay would not advance them."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(dev)
        opt = torch.optim.Adagrad(m.parameters(), lr=0.1)
        counter = torch.zeros(())

        def step(x):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
            counter.add_(1)
        s = torch_pjrt.capture_step(step) if capture else step
        for i in range(6):
            s(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)).to(dev))
        return opt.state[m.weight]["step"], counter, m.weight.detach().cpu()

    with pytest.warns(RuntimeWarning, match="writes a CPU tensor that outlives it"):
        got = run("tpu", True)
    want = run("cpu", False)
    assert float(got[0]) == float(want[0]) == 6 and float(got[1]) == 6
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


def test_learning_rate_schedules_are_followed():
    """A scheduler stepped inside the step makes it unreplayable (a replay would
    not advance it); one stepped outside changes the lr between calls, and the
    next call records the step again with the new lr."""
    def run(dev, capture, inside):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        sch = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)

        def step(x):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
            if inside:
                sch.step()
        s = torch_pjrt.capture_step(step) if capture else step
        ws = []
        for i in range(14):
            s(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)).to(dev))
            if not inside:
                sch.step()
            ws.append(m.weight.detach().cpu().clone())
        return ws

    for inside in (True, False):
        m0 = torch_pjrt.metrics()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = run("tpu", True, inside)
        for g, r in zip(got, run("cpu", False, inside)):
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
        warned = any("LR scheduler (StepLR) steps inside the step" in str(x.message) for x in w)
        assert warned == inside
        if not inside:
            assert _delta(m0, "capture_replays") > 0


def test_gradient_accumulation_over_two_signatures_with_grads_set_to_none():
    """step(x, do_step): backward every call, optimizer step and
    zero_grad(set_to_none=True) every other call. A replay cannot set p.grad
    again once the other signature set it to None; the grads it would write
    are held by nothing else then, so the step is recorded again instead."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(x, do_step):
            m(x).square().mean().backward()
            if do_step:
                opt.step()
                opt.zero_grad(set_to_none=True)
        s = torch_pjrt.capture_step(step) if capture else step
        ws = []
        for i in range(12):
            s(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)).to(dev), i % 2 == 1)
            ws.append(m.weight.detach().cpu().clone())
        return ws

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = run("tpu", True)
    for g, r in zip(got, run("cpu", False)):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_host_data_read_inside_the_step_is_not_replayed():
    """A step that uploads its own batch (not a tpu argument): the uploads differ
    between the two recordings, so the step is never replayed with a stale batch."""
    ref, step_r, dev, step_d = _pair()
    batches = iter(_batches(6))
    expected = [step_r(x, y) for x, y in _batches(6)]  # (outside: the step must not train a CPU model)

    def step():
        x, y = next(batches)
        return step_d(x.to("tpu"), y.to("tpu"))

    captured = torch_pjrt.capture_step(step)
    with pytest.warns(RuntimeWarning, match="copied from the host"):
        losses = [captured() for _ in range(6)]
    for got, want in zip(losses, expected):
        torch.testing.assert_close(got.cpu(), want, rtol=RTOL, atol=ATOL)


def test_cpu_tensor_arguments_are_not_replayed():
    ref, step_r, dev, step_d = _pair()
    captured = torch_pjrt.capture_step(lambda x, y: step_d(x.to("tpu"), y.to("tpu")))
    m0 = torch_pjrt.metrics()
    with pytest.warns(RuntimeWarning, match="cpu tensor"):
        for x, y in _batches(5):
            torch.testing.assert_close(captured(x, y).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    assert _delta(m0, "capture_recordings") == 0 and _delta(m0, "capture_replays") == 0


def test_new_argument_shapes_record_again():
    ref, step_r, dev, step_d = _pair()
    captured = torch_pjrt.capture_step(step_d)
    batches = _batches(6) + _batches(5, rows=3, seed=2) + _batches(2)
    for x, y in batches:
        torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    assert len(captured._signatures) == 2
    for p, q in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=RTOL, atol=ATOL)


def test_returned_structures_and_views():
    ref, dev = _model(), _model().to("tpu")

    def forward(m):
        def f(x, scale):
            out = m(x) * scale
            return {"out": out, "first": out[0], "t": out.t(), "n": 3}
        return f

    captured = torch_pjrt.capture_step(forward(dev))
    results = []
    with torch.no_grad():
        for x, _ in _batches(6):
            got, want = captured(x.to("tpu"), 2.0), forward(ref)(x, 2.0)
            results.append((got, want))
            assert got["n"] == 3
            for k in ("out", "first", "t"):
                assert got[k].shape == want[k].shape
                torch.testing.assert_close(got[k].cpu(), want[k], rtol=RTOL, atol=ATOL)
            assert got["first"].untyped_storage().data_ptr() == got["out"].untyped_storage().data_ptr()
    for got, want in results:  # earlier outputs keep their own values
        torch.testing.assert_close(got["out"].cpu(), want["out"], rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        assert captured.replayable(x.to("tpu"), 2.0)[0] is True
        assert captured.replayable(x.to("tpu"), 3.0) == (None, None)  # another scalar: recorded on its own
    assert captured.replayable(x.to("tpu"), 2.0) == (None, None)  # grad mode is part of the signature


def test_a_step_that_raises_leaves_no_recording_open():
    dev = _model().to("tpu")
    calls = [0]

    def step(x):
        calls[0] += 1
        if calls[0] == 2:
            raise ValueError("boom")
        return dev(x).sum()

    captured = torch_pjrt.capture_step(step)
    x = torch.randn(2, 16)
    captured(x.to("tpu"))
    with pytest.raises(ValueError, match="boom"):
        captured(x.to("tpu"))
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(captured(x.to("tpu")).cpu(), _model()(x).sum(), rtol=RTOL, atol=ATOL)
    y = torch.randn(3, 16, device="tpu")
    assert torch.equal((y + 1).cpu(), y.cpu() + 1)  # eager still works after the step


def test_reset_after_replacing_the_optimizer():
    ref, step_r, dev, step_d = _pair()
    captured = torch_pjrt.capture_step(lambda x, y: holder[0](x, y))
    holder = [step_d]
    batches = _batches(12)
    for x, y in batches[:6]:
        captured(x.to("tpu"), y.to("tpu"))
        step_r(x, y)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05)
    holder[0] = _train_step(dev, torch.optim.SGD(dev.parameters(), lr=0.05))
    step_r = _train_step(ref, opt_r)
    captured.reset()
    for x, y in batches[6:]:
        torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)


def test_a_step_follows_its_model_into_eval_mode_and_back():
    """model.eval() between calls: batch norm then uses its running
    statistics, as on CPU, not the recording made in training mode; back in
    training mode the first recording replays again."""
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))

    def forward_of(model):
        def forward(x):
            with torch.no_grad():
                return model(x)
        return forward

    ref, dev = make(), make().to("tpu")
    step_r, step_d = forward_of(ref), torch_pjrt.capture_step(forward_of(dev))
    before = torch_pjrt.metrics()
    for mode in (True, False, True, False):
        ref.train(mode)
        dev.train(mode)
        for x, _ in _batches(4):
            torch.testing.assert_close(step_d(x.to("tpu")).cpu(), step_r(x), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(dev[1].running_mean.cpu(), ref[1].running_mean, rtol=RTOL, atol=ATOL)
    assert _delta(before, "capture_replays") >= 10  # 16 calls; 3 warm up and record per mode


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        torch_pjrt.capture_step(3)
    with pytest.raises(ValueError, match="warmup"):
        torch_pjrt.capture_step(lambda: None, warmup=-1)


_WARM_START = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch_pjrt
import torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
@torch_pjrt.capture_step
def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss
g = torch.Generator().manual_seed(1)
m0 = torch_pjrt.metrics()
losses = [step(torch.randn(8, 16, generator=g).to("tpu"), torch.randn(8, 4, generator=g).to("tpu")).item()
          for _ in range(5)]
m1 = torch_pjrt.metrics()
print(json.dumps({"losses": losses, "xla_compiles": m1["xla_compiles"] - m0["xla_compiles"],
                  "replays": m1["capture_replays"] - m0["capture_replays"],
                  "prefetched_used": m1["capture_prefetched_used"] - m0["capture_prefetched_used"]}))
"""


def test_warm_start_in_a_second_process_compiles_nothing(tmp_path):
    import json

    cache = tmp_path / "cache"
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache), TORCH_PJRT_EAGER="async")

    def run(**extra):
        p = subprocess.run([sys.executable, "-c", _WARM_START, ROOT], env=dict(env, **extra), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "Traceback" not in p.stderr and "terminate" not in p.stderr, p.stderr[-3000:]
        # (a manifest names entries of this configuration only: none is foreign)
        assert "ignoring cache entry" not in p.stderr, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    cold = run()
    manifests = list((cache / "capture").glob("*.json"))
    assert len(manifests) == 1  # the step's program keys, for the next process
    warm = run()
    assert cold["xla_compiles"] > 0 and cold["replays"] == 2 and cold["prefetched_used"] == 0
    assert warm["xla_compiles"] == 0, "the second process compiled again"
    assert warm["replays"] == 2
    assert warm["prefetched_used"] > 0, "nothing was loaded ahead from the manifest"
    assert warm["losses"] == cold["losses"]
    manifests[0].write_text("{not json")  # a damaged manifest: ignored, written anew
    again = run()
    assert again["xla_compiles"] == 0 and again["replays"] == 2 and again["losses"] == cold["losses"]
    assert json.loads(manifests[0].read_text())["programs"]
    # Other XLA_FLAGS write other entries (the flags are part of each entry's
    # identity): that process keeps a manifest of its own, so neither loads
    # the other's entries ahead only to find them foreign.
    other = run(XLA_FLAGS="--xla_cpu_enable_fast_min_max=false")
    assert other["xla_compiles"] > 0 and other["losses"] == cold["losses"]
    assert len(list((cache / "capture").glob("*.json"))) == 2
    assert run()["xla_compiles"] == 0


def test_arguments_written_in_place_and_aliased_arguments():
    def f(buf, a, b):
        buf.add_(a * 2 + b)  # an argument updated in place
        return buf.sum()

    captured = torch_pjrt.capture_step(f)
    g = torch.Generator().manual_seed(5)
    for i in range(7):
        a, b = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
        buf = torch.randn(4, 3, generator=g)
        want_buf = buf + (a * 2 + b)
        tb, ta = buf.to("tpu"), a.to("tpu")
        # from the 6th call the same tensor is passed twice: not the recorded step's aliasing
        tb_arg = ta if i >= 5 else b.to("tpu")
        if i >= 5:
            want_buf = buf + a * 3
        got = captured(tb, ta, tb_arg)
        torch.testing.assert_close(tb.cpu(), want_buf, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got.cpu(), want_buf.sum(), rtol=RTOL, atol=ATOL)
    assert captured.replayable(tb, ta, b.to("tpu"))[0] is True


def test_generation_with_a_captured_decode_step_matches_cpu():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import tiny_llama

    prompt = tiny_llama.prompt()
    ref = tiny_llama.generate(tiny_llama.build(), prompt, 40)
    m0 = torch_pjrt.metrics()
    out = tiny_llama.generate(tiny_llama.build().to("tpu"), prompt, 40, capture=True)
    assert torch.equal(out.cpu(), ref)
    # capacities 16, 32 and 64 each: one warm-up call, two recordings, then replays
    assert _delta(m0, "capture_replays") >= 39 - 3 * 3
    assert _delta(m0, "capture_not_replayable") == 0


def test_a_step_that_seeds_its_own_generator_replays_the_same_keys():
    def run(capture):
        model = _model(dropout=0.5).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        inner = _train_step(model, opt)

        def step(x, y):
            torch.manual_seed(7)  # the same dropout masks every step, in eager
            return inner(x, y)
        if capture:
            step = torch_pjrt.capture_step(step)
        return [step(x.to("tpu"), y.to("tpu")).item() for x, y in _batches(7)]

    eager, replayed = run(False), run(True)
    assert torch_pjrt.metrics()["capture_replays"] > 0
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-checkpoint", "compiled-checkpoint"])
def test_a_checkpointed_dropout_replays_the_forwards_mask_in_its_recomputation(compiled):
    # Activation checkpointing recomputes the dropout in the backward with the
    # forward's key (eager: the generator rewound; compiled: the saved key):
    # a replay draws that key once and uses it twice, as eager does. (It drew
    # two keys, so the backward saw another mask: other losses from the step
    # after the first replay on.) Compiled, the saved key stays on the device
    # (a CPU copy made every call a host upload, never replayed).
    from torch.utils.checkpoint import checkpoint

    def run(capture):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _model(dropout=0.3).to("tpu")
        fwd = lambda x: checkpoint(model, x, use_reentrant=False)  # noqa: E731
        if compiled:
            fwd = torch.compile(fwd, backend="tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(fwd(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        if capture:
            step = torch_pjrt.capture_step(step)
        out = []
        for i, (x, y) in enumerate(_batches(7)):
            torch.manual_seed(100 + i)
            out.append(step(x.to("tpu"), y.to("tpu")).item())
        return out

    eager = run(False)
    before = torch_pjrt.metrics()["capture_replays"]
    replayed = run(True)
    assert torch_pjrt.metrics()["capture_replays"] - before >= 3
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=RTOL, atol=ATOL)


def test_a_step_with_compiled_pieces_replays_them_in_its_program():
    ref, step_r, dev, _ = _pair()
    opt = torch.optim.AdamW(dev.parameters(), lr=1e-2, capturable=True)
    captured = torch_pjrt.capture_step(_train_step(dev, opt, forward=torch.compile(dev, backend="tpu")))
    m0 = torch_pjrt.metrics()
    for x, y in _batches(7):
        torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    assert _delta(m0, "fused_programs_recorded") > 0  # the compiled graphs were part of the recorded traces
    assert _delta(m0, "capture_replays") == 4
    for p, q in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=RTOL, atol=ATOL)


def test_an_argument_viewing_another_base_is_not_replayed_with_the_recording():
    def f(v):
        v.mul_(2)  # writes through a view into its base
        return v.sum()

    captured = torch_pjrt.capture_step(f)
    bases = [torch.arange(12.0).reshape(3, 4) for _ in range(5)] + [torch.arange(16.0).reshape(4, 4)]
    for base in bases:
        tb = base.to("tpu")
        got = captured(tb[1])  # same view geometry (offset 4, 4 elements), bases of 12 then 16 elements
        want = base.clone()
        want[1].mul_(2)
        torch.testing.assert_close(tb.cpu(), want)
        torch.testing.assert_close(got.cpu(), want[1].sum())


def test_a_captured_function_called_inside_a_captured_step_is_part_of_it():
    ref, step_r, dev, step_d = _pair()
    forward = torch_pjrt.capture_step(lambda x: dev(x))  # captured on its own too
    opt = torch.optim.AdamW(dev.parameters(), lr=1e-2, capturable=True)
    captured = torch_pjrt.capture_step(_train_step(dev, opt, forward=forward))
    m0 = torch_pjrt.metrics()
    for x, y in _batches(6):
        torch.testing.assert_close(captured(x.to("tpu"), y.to("tpu")).cpu(), step_r(x, y), rtol=RTOL, atol=ATOL)
    assert _delta(m0, "capture_replays") == 3
    with torch.no_grad():
        x = torch.randn(8, 16)
        for _ in range(5):  # and alone, outside the step
            torch.testing.assert_close(forward(x.to("tpu")).cpu(), ref(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_freezing_and_unfreezing_a_parameter_between_calls_records_again(set_to_none):
    """p.requires_grad_(False) between calls, then True again: autograd stops
    (then starts again) computing its grad, so SGD leaves it alone (grad set
    to None) or moves it by momentum alone (grad zeroed, kept). A replay of a
    recording made with the other flag would go on updating it: the call
    records the step again."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        def step(x):
            opt.zero_grad(set_to_none=set_to_none)
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        s = torch_pjrt.capture_step(step) if capture else step
        seen = []
        for i in range(16):
            if i == 6:
                m[0].weight.requires_grad_(False)
            if i == 11:
                m[0].weight.requires_grad_(True)
            loss = s(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)).to(dev))
            seen.append((loss.cpu(), [p.detach().cpu().clone() for p in m.parameters()],
                         [None if p.grad is None else p.grad.cpu().clone() for p in m.parameters()]))
        return seen

    m0 = torch_pjrt.metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # recorded again, never given up on
        got = run("tpu", True)
    # warm-up, 2 recordings, 3 replays; after each flag change 2 recordings, 3 replays
    assert _delta(m0, "capture_replays") == 9
    for i, ((gl, gp, gg), (rl, rp, rg)) in enumerate(zip(got, run("cpu", False))):
        torch.testing.assert_close(gl, rl, rtol=1e-4, atol=1e-5)
        for a, b in zip(gp, rp):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        for a, b in zip(gg, rg):
            assert (a is None) == (b is None), f"call {i}: grad {a} on tpu, {b} on cpu"
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_freezing_a_parameter_of_a_step_that_steps_no_optimizer():
    """A backward-only step (gradient accumulation, the optimizer stepped
    outside): a frozen, then unfrozen parameter gets no grad, then grads
    again, as on CPU; no optimizer's hyperparameters are there to notice it."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def micro(x):
            m(x).square().mean().backward()
        s = torch_pjrt.capture_step(micro) if capture else micro
        seen = []
        for i in range(24):
            if i == 8:
                m.bias.requires_grad_(False)
                m.bias.grad = None
            if i == 16:
                m.bias.requires_grad_(True)
            s(torch.randn(4, 3, generator=torch.Generator().manual_seed(i)).to(dev))
            seen.append([None if p.grad is None else p.grad.cpu().clone() for p in m.parameters()])
            if i % 2:
                opt.step()
                opt.zero_grad(set_to_none=False)
            seen.append([p.detach().cpu().clone() for p in m.parameters()])
        return seen

    m0 = torch_pjrt.metrics()
    got = run("tpu", True)
    assert _delta(m0, "capture_replays") > 0
    for i, (g, r) in enumerate(zip(got, run("cpu", False))):
        for a, b in zip(g, r):
            assert (a is None) == (b is None), f"entry {i}: {a} on tpu, {b} on cpu"
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_freezing_a_parameter_of_a_compiled_piece_records_again():
    """The forward is a torch.compile'd piece, whose inputs no eager op takes
    in grad mode: its parameters' flags are noted too."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        forward = torch.compile(m, backend="tpu") if capture else m

        def step(x):
            opt.zero_grad()
            loss = forward(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss.detach()
        s = torch_pjrt.capture_step(step) if capture else step
        seen = []
        for i in range(12):
            if i == 5:
                m[0].weight.requires_grad_(False)
            if i == 9:
                m[0].weight.requires_grad_(True)
            seen.append(s(torch.randn(3, 4, generator=torch.Generator().manual_seed(i)).to(dev)).cpu())
            seen.extend(p.detach().cpu().clone() for p in m.parameters())
        return seen

    m0 = torch_pjrt.metrics()
    got = run("tpu", True)
    assert _delta(m0, "capture_replays") > 0
    for a, b in zip(got, run("cpu", False)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_gradients_of_arguments_are_set_by_replays():
    """An argument that requires grad gets its .grad from the step's backward
    on replays too: set when it had none (the returned x.grad is that tensor),
    accumulated into when it had one, as autograd does on CPU."""
    w_cpu = torch.randn(3, generator=torch.Generator().manual_seed(9))
    w = w_cpu.to("tpu")

    def step_for(w):
        def f(x):
            (x * w).pow(2).sum().backward()
            return x.grad
        return f

    def run(dev, capture, w, accumulate):
        s = torch_pjrt.capture_step(step_for(w)) if capture else step_for(w)
        seen = []
        for i in range(7):
            x = torch.randn(3, generator=torch.Generator().manual_seed(i)).to(dev).requires_grad_()
            if accumulate:  # a grad the step adds to
                x.grad = torch.full((3,), float(i)).to(dev)
            g = s(x)
            assert x.grad is not None, f"call {i}: x.grad is None"
            assert g is x.grad
            seen.append(x.grad.cpu())
        return seen

    for accumulate in (False, True):
        m0 = torch_pjrt.metrics()
        got = run("tpu", True, w, accumulate)
        assert _delta(m0, "capture_replays") == 4
        for a, b in zip(got, run("cpu", False, w_cpu, accumulate)):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_a_persistent_argument_accumulates_its_gradient_over_replays():
    """The same leaf passed every call (an input being optimized) with a
    model's training step: its grad accumulates over calls as on CPU, and
    the model trains as on CPU."""
    def run(dev, capture):
        torch.manual_seed(0)
        m = _model().to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3)).to(dev).requires_grad_()

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            return loss.detach()
        s = torch_pjrt.capture_step(step) if capture else step
        seen = []
        for _, y in _batches(7):
            loss = s(x, y.to(dev))
            seen.append((loss.cpu(), x.grad.cpu().clone(), [p.detach().cpu().clone() for p in m.parameters()]))
        return seen

    m0 = torch_pjrt.metrics()
    got = run("tpu", True)
    # the first call (x.grad None) is a signature of its own: then warm-up, two recordings, three replays
    assert _delta(m0, "capture_replays") == 3
    for (gl, gx, gp), (rl, rx, rp) in zip(got, run("cpu", False)):
        torch.testing.assert_close(gl, rl, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(gx, rx, rtol=RTOL, atol=ATOL)
        for a, b in zip(gp, rp):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_a_step_returning_a_live_autograd_graph_is_not_replayed():
    # Its caller may backpropagate through an earlier call's result; a replay
    # would neither rebuild that graph nor keep the values it saved (it wrote
    # the next call's intermediates over them: gradients off by ~4 before).
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    dev = torch.nn.Linear(8, 8).to("tpu")
    dev.load_state_dict(lin.state_dict())
    captured = torch_pjrt.capture_step(lambda x: dev(x).tanh() * 2)
    xs = [torch.randn(4, 8) for _ in range(6)]
    with pytest.warns(RuntimeWarning, match="autograd graph no backward in the step went through"):
        outs = [captured(x.to("tpu")) for x in xs]
    assert captured.replayable(xs[0].to("tpu"))[0] is False
    assert all(o.grad_fn is not None for o in outs)  # as eager: every result carries its graph
    outs[2].sum().backward()
    (lin(xs[2]).tanh() * 2).sum().backward()
    torch.testing.assert_close(dev.weight.grad.cpu(), lin.weight.grad, rtol=RTOL, atol=ATOL)


def test_a_training_step_inside_an_autocast_region_replays_and_matches_fused_eager():
    # autocast's cache of weight casts lives until the region's exit, after
    # the step: recorded with it, every replay found a freed cast and recorded
    # again (no replay at all).
    def run(capture):
        torch.manual_seed(0)
        model = _model().to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
        step = _train_step(model, opt)
        step = torch_pjrt.capture_step(step) if capture else step
        losses = []
        for x, y in _batches(8):
            with torch.autocast("tpu", dtype=torch.bfloat16):
                if capture:
                    losses.append(step(x.to("tpu"), y.to("tpu")).cpu())
                else:
                    with torch_pjrt.fused():
                        losses.append(step(x.to("tpu"), y.to("tpu")).cpu())
        return torch.stack(losses), [p.cpu() for p in model.parameters()]

    want, want_params = run(False)
    m0 = torch_pjrt.metrics()
    got, got_params = run(True)
    assert _delta(m0, "capture_replays") == 5
    assert _delta(m0, "capture_recordings") == 2
    torch.testing.assert_close(got, want)
    for p, q in zip(got_params, want_params):
        torch.testing.assert_close(p, q)


def test_a_recording_is_kept_per_default_dtype_autocast_dtype_and_matmul_precision():
    captured = torch_pjrt.capture_step(lambda x: x + torch.ones(3, device="tpu"))
    x = torch.randn(3, device="tpu")
    try:
        for dtype in [torch.float32] * 4 + [torch.float64] * 4:
            torch.set_default_dtype(dtype)
            assert captured(x).dtype == dtype  # float32 + a factory of the default dtype
    finally:
        torch.set_default_dtype(torch.float32)
    lin = torch.nn.Linear(4, 4).to("tpu")
    step = torch_pjrt.capture_step(lambda x: lin(x).float().sum())
    x = torch.randn(2, 4, device="tpu")
    seen = []
    with torch.no_grad():
        for dtype in [torch.bfloat16] * 4 + [torch.float16]:
            with torch.autocast("tpu", dtype=dtype):
                assert step(x).dtype == torch.float32
                seen.append(step.replayable(x)[0])
    # warm-up, recording, replays; the first float16 call is a new signature
    # (warming up), not a replay of the bfloat16 program
    assert seen == [None, None, True, True, None]
    before = torch.get_float32_matmul_precision()
    seen = []
    try:
        with torch.no_grad():
            for precision in ["highest"] * 4 + ["high"]:
                torch.set_float32_matmul_precision(precision)
                step(x)
                seen.append(step.replayable(x)[0])
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen == [None, None, True, True, None]


def test_signatures_kept_are_bounded_and_the_hot_one_survives():
    # A Python number that changes every call makes a new signature each
    # time: without a bound a long run kept one per call.
    from torch_pjrt import step_capture
    w = torch.randn(8, 8)
    wd = w.to("tpu")
    captured = torch_pjrt.capture_step(lambda x, scale: (x @ wd * scale).sum())
    x = torch.randn(8, 8)
    xd = x.to("tpu")
    n = step_capture._MAX_SIGNATURES
    with pytest.warns(RuntimeWarning, match="more than 256 different argument signatures"):
        for i in range(n + 50):
            captured(xd, 1.0)  # the hot signature, used every call
            got = captured(xd, 0.5 + i)
    torch.testing.assert_close(got.cpu(), (x @ w * (0.5 + n + 49)).sum(), rtol=1e-5, atol=1e-3)
    assert len(captured._signatures) <= n
    assert captured.replayable(xd, 1.0)[0] is True  # kept: recently used
