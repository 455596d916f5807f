"""Fused eager (torch_pjrt.fused(), TORCH_PJRT_EAGER=fused): recorded traces
run as one program; results equal CPU (and strict eager), flushes happen where
values are needed, a repeating trace compiles once, float scalars stay runtime
inputs, errors name the op."""
import contextlib
import gc
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt
from conftest import assert_same, make, run_json, tpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))


def metrics():
    torch_pjrt.fused_flush()
    return torch_pjrt.metrics()


def delta(m0, m1, key):
    return m1[key] - m0[key]


def chain(x, w, s=0.5):
    y = torch.relu(x @ w + 1.0) * s
    return y.sum(0) + x[3], torch.tanh(y).t().contiguous()


def test_chain_equals_cpu_one_flush():
    x, w = make((16, 16), seed=1), make((16, 16), seed=2)
    xt, wt = tpu(x), tpu(w)
    m0 = metrics()
    with torch_pjrt.fused():
        assert torch_pjrt.fused_active()
        out = chain(xt, wt)
    m1 = torch_pjrt.metrics()
    assert delta(m0, m1, "fused_flushes") == 1
    assert m1["fused_flushes_by_reason"]["region_end"] - m0["fused_flushes_by_reason"].get("region_end", 0) == 1
    assert delta(m0, m1, "fused_ops_recorded") >= 8
    assert_same(out, chain(x, w))


def test_repeating_trace_compiles_once_float_scalars_runtime():
    x, w = make((8, 8), seed=3), make((8, 8), seed=4)
    xt, wt = tpu(x), tpu(w)
    m0 = metrics()
    for i in range(6):
        s = 0.25 + i * 0.125  # another float scalar every time: a runtime input
        with torch_pjrt.fused():
            out = chain(xt, wt, s)
        assert_same(out, chain(x, w, s))
    m1 = torch_pjrt.metrics()
    assert delta(m0, m1, "fused_programs_compiled") <= 1  # (the first sighting runs op by op)
    assert delta(m0, m1, "fused_cache_hits") >= 4
    assert delta(m0, m1, "fused_op_by_op_runs") <= 1


def test_views_inplace_aliasing():
    a = torch.zeros(6, 8)
    at = tpu(a)
    with torch_pjrt.fused():
        v = at[2]
        v.add_(3)
        at[:, 1].mul_(2)
        at += 1
        t = at.t()
        t[0, :3] = 7
        d = at.diagonal()
        d.mul_(-1)
        b = at[1:4].clone()
        at[1:4] += b
    v = a[2]
    v.add_(3)
    a[:, 1].mul_(2)
    a += 1
    a.t()[0, :3] = 7
    a.diagonal().mul_(-1)
    b_ref = a[1:4].clone()
    a[1:4] += b_ref
    assert_same(at, a)
    assert_same(v.cpu() if False else at[2], a[2])


def test_reads_inside_region_see_recorded_values():
    x = make((5, 5))
    xt = tpu(x)
    m0 = metrics()
    with torch_pjrt.fused():
        y = xt * 2 + 1
        first = y.sum().item()  # a host read runs the trace
        y.mul_(3)
        z = y.cpu()
    m1 = torch_pjrt.metrics()
    assert first == pytest.approx((x * 2 + 1).sum().item(), rel=1e-6)
    torch.testing.assert_close(z, (x * 2 + 1) * 3)
    reasons = m1["fused_flushes_by_reason"]
    assert reasons["host_read"] - m0["fused_flushes_by_reason"].get("host_read", 0) >= 2


def test_data_dependent_and_fallback_flush():
    x = make((6, 6))
    xt = tpu(x)
    with torch_pjrt.fused():
        y = xt - 0.5
        nz = torch.nonzero(y > 0)  # data-dependent shape: the trace runs first
        r = y.sum(1)
    assert_same(nz, torch.nonzero((x - 0.5) > 0))
    assert_same(r, (x - 0.5).sum(1))


def test_random_same_as_strict():
    torch.manual_seed(7)
    strict = (torch.rand(64, device="tpu") * 2, torch.nn.functional.dropout(torch.ones(64, device="tpu"), 0.5))
    strict = [t.cpu() for t in strict]
    torch.manual_seed(7)
    with torch_pjrt.fused():
        fused = (torch.rand(64, device="tpu") * 2, torch.nn.functional.dropout(torch.ones(64, device="tpu"), 0.5))
    for f, s in zip(fused, strict):
        assert torch.equal(f.cpu(), s)


def test_training_matches_cpu_one_flush_per_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    data = [(make((4, 8), seed=10 + i), make((4, 4), seed=20 + i)) for i in range(6)]
    m0 = metrics()
    for x, y in data:
        with torch_pjrt.fused():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(tpu(x)), tpu(y))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            got = loss.item()
        ropt.zero_grad()
        rloss = torch.nn.functional.mse_loss(ref(x), y)
        rloss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step()
        assert got == pytest.approx(rloss.item(), rel=1e-5, abs=1e-6)
    m1 = torch_pjrt.metrics()
    for p, rp in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), rp.detach(), rtol=1e-5, atol=1e-5)
    # loss.item() and the region end: at most two flushes a step.
    assert delta(m0, m1, "fused_flushes") <= 2 * len(data)
    assert delta(m0, m1, "fused_programs_compiled") >= 1
    assert m1["cpu_fallbacks"] == m0["cpu_fallbacks"]


def test_autocast_in_region():
    x, w = make((8, 8)), make((8, 8), seed=5)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        strict = (tpu(x) @ tpu(w)).cpu()
    with torch_pjrt.fused(), torch.autocast("tpu", dtype=torch.bfloat16):
        fused = tpu(x) @ tpu(w)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.cpu(), strict, rtol=1.6e-2, atol=1e-2)


def test_dead_values_never_leave():
    x = tpu(torch.ones(256, 256))

    def run():
        with torch_pjrt.fused():
            y = x
            for _ in range(8):
                y = y * 1.5 + 1  # every intermediate dies inside the trace
        return y

    run(), run()  # the first sighting runs op by op; the second compiles the trace
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    y = run()
    torch.tpu.synchronize()
    nbytes = 256 * 256 * 4
    assert torch.tpu.memory_allocated() - base == nbytes  # only y
    # Intermediates never existed as buffers (the slack: the runtime-scalar pack).
    assert torch.tpu.max_memory_allocated() - base <= nbytes + 4096
    expected = torch.ones(256, 256)
    for _ in range(8):
        expected = expected * 1.5 + 1
    torch.testing.assert_close(y.cpu(), expected)


def momentum_step(p, m, g, lr):
    m.mul_(0.9).add_(g, alpha=0.1)
    p.add_(m, alpha=-lr)


def test_overwritten_inputs_are_donated_memory_does_not_double():
    n = 1 << 20  # 4 MiB each
    p, m, g = make((n,), seed=30), torch.zeros(n), make((n,), seed=31)
    pt, mt, gt = tpu(p), tpu(m), tpu(g)
    m0 = metrics()
    peaks = []
    for step in range(4):
        torch.tpu.synchronize()
        base = torch.tpu.memory_allocated()
        torch.tpu.reset_peak_memory_stats()
        with torch_pjrt.fused():
            momentum_step(pt, mt, gt, 0.01 * (step + 1))
        torch.tpu.synchronize()
        peaks.append(torch.tpu.max_memory_allocated() - base)
        momentum_step(p, m, g, 0.01 * (step + 1))
        # (XLA may fuse a multiply and an add into one rounding: 1 ulp)
        torch.testing.assert_close(pt.cpu(), p, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mt.cpu(), m, rtol=1e-6, atol=1e-6)
    m1 = torch_pjrt.metrics()
    # Step 0 runs op by op (new buffers for m and p); from step 1 on the fused
    # program writes p and m into their old buffers.
    assert peaks[0] >= 2 * 4 * n
    assert max(peaks[1:]) <= 4096, peaks  # (the slack: the runtime-scalar pack)
    assert delta(m0, m1, "fused_donated_buffers") == 6
    assert delta(m0, m1, "fused_donated_bytes") == 6 * 4 * n


def test_donation_never_corrupts_other_holders():
    # Whatever else still holds an overwritten input's buffer (a queued
    # execution reading it, a tensor that shares it) keeps its values; views
    # of the overwritten storage see the new ones.
    n = 512
    p0, g = make((n, n), seed=32), make((n, n), seed=33)
    pt, gt = tpu(p0), tpu(g)
    p, m = p0.clone(), torch.zeros(n, n)
    mt = tpu(m)
    for step in range(4):
        before = pt.cpu()
        r = pt @ pt  # launched ahead (strict eager), may still be running at the flush
        kept = pt.clone()
        view = pt[1:, ::2]
        with torch_pjrt.fused():
            momentum_step(pt, mt, gt, 0.5)
        momentum_step(p, m, g, 0.5)
        torch.testing.assert_close(r.cpu(), before @ before, rtol=1e-4, atol=1e-3)
        assert torch.equal(kept.cpu(), before)
        torch.testing.assert_close(view.cpu(), p[1:, ::2], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pt.cpu(), p, rtol=1e-6, atol=1e-6)
    m1 = torch_pjrt.metrics()
    assert m1["fused_donated_buffers"] + m1["fused_not_donated_buffers"] > 0


def test_strict_write_over_pending_storage():
    x = tpu(make((4, 4)))
    with torch_pjrt.fused():
        y = x * 2
        y.copy_(torch.full((4, 4), 5.0))  # a host copy replaces the value the trace owes
        z = y + 1
    assert torch.equal(z.cpu(), torch.full((4, 4), 6.0))


def test_index_error_names_op():
    x = tpu(make((4, 3)))
    idx = tpu(torch.tensor([0, 7]))
    with pytest.raises(IndexError, match="index_select|index out of range"):
        with torch_pjrt.fused():
            y = torch.index_select(x, 0, idx) * 2
            y.cpu()


def test_shape_error_raises_at_the_op():
    a, b = tpu(make((3, 4))), tpu(make((5, 6)))
    with torch_pjrt.fused():
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied|size mismatch"):
            a @ b


def test_generation_kv_cache_bounded_compiles():
    import tiny_llama

    model_cpu = tiny_llama.build()
    model = tiny_llama.build().to("tpu")
    prompt = tiny_llama.prompt()
    ref = tiny_llama.generate(model_cpu, prompt, 40)
    marks = {}

    def on_token(i):
        marks[i + 1] = torch_pjrt.metrics()["xla_compiles"]

    with torch_pjrt.fused():
        out = tiny_llama.generate(model, prompt, 40, on_token=on_token)
    assert torch.equal(out.cpu(), ref)
    # Prompt 8 + tokens: positions 25..31 all fit the 32-position capacity:
    # no new program while the cache does not grow.
    assert marks[23] == marks[17]


def _grown(x, n):
    # A trace whose shapes depend on n (as a cache that grows by one position
    # per token): another structure for every n. Read on the host at its end.
    y = torch.cat((x, x[:n] * 2.0)).sin() + 1.0
    return (y * y).sum().item(), y


def test_a_trace_back_only_after_many_others_is_not_compiled_at_once():
    """Nine traces in a cycle (each comes back after eight others, as each
    token's trace of a generate call whose cache grows one position a token
    comes back in the next call): the second cycle runs them op by op instead
    of compiling nine programs; a trace back at once compiles at its second
    sighting; the cold ones compile once their op-by-op runs have taken about
    as long as their compiles are expected to. Values equal CPU's throughout."""
    x = make((16,), seed=5)
    xt = tpu(x)
    sizes = range(2, 11)
    want = {n: _grown(x, n) for n in sizes}

    def cycle():
        for n in sizes:
            s, y = _grown(xt, n)
            assert s == pytest.approx(want[n][0], rel=1e-5)
            assert_same(y, want[n][1])

    with torch_pjrt.fused():
        m0 = metrics()
        cycle()
        cycle()
        m1 = metrics()
        assert delta(m0, m1, "fused_programs_compiled") == 0
        assert delta(m0, m1, "fused_deferred_compiles") == len(sizes)
        # A tight loop: the same trace twice in a row.
        _grown(xt, 12)
        _grown(xt, 12)
        m2 = metrics()
        assert delta(m1, m2, "fused_programs_compiled") == 1
        assert delta(m1, m2, "fused_deferred_compiles") == 0
        # Rent or buy: the cold traces compile in the end (each run op by op
        # costs ~0.1 ms of host time here, a compile ~1-10 ms per op).
        for rounds in range(20000):
            if delta(m2, torch_pjrt.metrics(), "fused_programs_compiled") >= len(sizes):
                break
            for n in sizes:
                _grown(xt, n)
        m3 = metrics()
        assert delta(m2, m3, "fused_programs_compiled") == len(sizes), rounds
        cycle()
        assert delta(m3, metrics(), "fused_cache_hits") == len(sizes)


def test_a_full_trace_cache_keeps_the_loop_that_runs_now():
    """The fused trace cache holds TORCH_PJRT_FUSED_CACHE_ENTRIES traces; when
    full, the least recently flushed half goes. A hot loop's compiled program
    and a cycle of traces on their way to compiling (their sightings so far)
    outlive a stream of one-off traces (the whole cache used to be dropped,
    so both started over). clear_executable_cache forgets all of them."""
    out = run_json(r"""
import json, torch, torch_pjrt
m = torch_pjrt.metrics
def hot(x):
    return ((x * 2 + 1).sum()).item()
def cold(n):  # a trace of a new structure each time
    return (torch.ones(n, device="tpu") * 3).sum().item()
x = torch.ones(8, device="tpu")
with torch_pjrt.fused():
    hot(x); hot(x); hot(x)  # back to back: compiled at its second sighting (the first also made x under TORCH_PJRT_EAGER=fused)
    c0 = m()["fused_programs_compiled"]
    for n in range(1, 40):
        assert hot(x) == 24.0 and cold(n) == 3.0 * n
    c1 = m()["fused_programs_compiled"]
    size = m()["fused_cache_size"]
    torch_pjrt.clear_executable_cache()
    cleared = m()["fused_cache_size"]
    hot(x)
    c2 = m()["fused_programs_compiled"]
print("RESULT " + json.dumps({"c0": c0, "c1": c1, "c2": c2, "size": size, "cleared": cleared}))
""", TORCH_PJRT_FUSED_CACHE_ENTRIES=8, TORCH_PJRT_CACHE_DIR="")
    assert out["c0"] == 1
    assert out["c1"] == 1, out  # the hot program was never dropped (one-off traces are not compiled)
    assert 0 < out["size"] <= 8, out
    assert out["cleared"] == 0
    assert out["c2"] == 1, out  # after clearing, the trace is new again: not compiled at its first sighting


def test_a_cycle_outlives_a_full_trace_cache():
    # Nine traces in a cycle, as in the test above, with the cache filled by
    # one-off traces so that it overflows during the first cycle: the cycle's
    # second round still defers all nine (it found a third missing when the
    # whole cache was dropped at the bound).
    out = run_json(r"""
import json, torch, torch_pjrt
m = torch_pjrt.metrics
xt = torch.ones(16, device="tpu")
def grown(n):
    y = torch.cat((xt, xt[:n] * 2.0)).sin() + 1.0
    return (y * y).sum().item()
with torch_pjrt.fused():
    for n in range(1, 59):
        (torch.ones(n, device="tpu") * 2).sum().item()
    d0 = m()["fused_deferred_compiles"]
    for _ in range(2):
        for n in range(2, 11):
            grown(n)
    d1 = m()["fused_deferred_compiles"]
print("RESULT " + json.dumps({"deferred": d1 - d0, "size": m()["fused_cache_size"]}))
""", TORCH_PJRT_FUSED_CACHE_ENTRIES=64, TORCH_PJRT_CACHE_DIR="")
    assert out["deferred"] == 9, out


def test_env_setting_and_size_bound():
    code = """
import torch, torch_pjrt
assert torch_pjrt.fused_active()
x = torch.ones(4, device="tpu")
for _ in range(25):
    x = x + 1
print(x.cpu()[0].item(), torch_pjrt.metrics()["fused_flushes_by_reason"].get("size_bound", 0))
"""
    env = dict(os.environ, TORCH_PJRT_EAGER="fused", TORCH_PJRT_FUSED_MAX_OPS="10", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    value, bounds = out.stdout.split()
    assert float(value) == 26.0
    assert int(bounds) >= 2


def test_out_of_memory_in_trace_names_op():
    limit = torch_pjrt.memory_limit()
    x = tpu(torch.ones(64, 64))
    torch.tpu.synchronize()
    try:
        torch_pjrt.set_memory_limit(torch.tpu.memory_allocated() + 64 * 64 * 4 * 3)
        with pytest.raises(torch.OutOfMemoryError, match=r"aten::"):
            with torch_pjrt.fused():
                keep = [x * float(i) for i in range(10)]  # all stay alive: too many outputs
                keep[0].cpu()
    finally:
        torch_pjrt.set_memory_limit(limit)


def test_error_names_python_line_when_recorded():
    code = """
import torch, torch_pjrt
x = torch.ones(64, 64, device="tpu")
torch.tpu.synchronize()
torch_pjrt.set_memory_limit(torch.tpu.memory_allocated() + 64 * 64 * 4 * 3)
try:
    with torch_pjrt.fused():
        keep = [x * float(i) for i in range(10)]  # THE_LINE
        keep[0].cpu()
except torch.OutOfMemoryError as e:
    print("OOM", e)
"""
    env = dict(os.environ, TORCH_PJRT_FUSED_LINES="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OOM" in out.stdout and "fused eager: aten::mul" in out.stdout, out.stdout
    assert "<string>:8" in out.stdout, out.stdout  # the list comprehension's line


def test_compiled_training_step_in_a_region_is_one_program():
    # torch.compile(backend="tpu") makes the step several graphs (forward,
    # backward, optimizer; graph breaks between them); inside fused() each
    # graph's program is one step of the trace, so from the second sighting
    # the whole step is one execution, parameters and optimizer state donated.
    def build(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.GELU(), torch.nn.Linear(512, 4)).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    ref, ropt = build("cpu")
    model, opt = build("tpu")
    compiled = torch.compile(step, backend="tpu")
    per_step = []
    for i in range(5):
        x, y = make((64, 8), seed=40 + i), make((64, 4), seed=50 + i)
        xt, yt = tpu(x), tpu(y)
        m0 = metrics()
        # Garbage from earlier tests in this worker, collected during the
        # step (Dynamo's compile allocates a lot), would lower the live bytes
        # under `base` and hide the step's peak: collected first, then held.
        gc.collect()
        gc.disable()
        try:
            torch.tpu.synchronize()
            base = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            with torch_pjrt.fused():
                loss = compiled(model, opt, xt, yt)
            got = loss.item()
        finally:
            gc.enable()
        m1 = torch_pjrt.metrics()
        per_step.append({k: delta(m0, m1, k) for k in ("executions", "fused_flushes", "fused_programs_recorded",
                                                        "fused_donated_buffers")})
        # Saved activations (64 x 512 floats, 128 KiB each), gradients and the
        # new parameters never exist as buffers of their own once fused.
        per_step[-1]["peak"] = torch.tpu.max_memory_allocated() - base
        assert got == pytest.approx(step(ref, ropt, x, y).item(), rel=1e-5, abs=1e-6)
    # (AdamW divides each gradient by its own scale: the last-bit differences
    # of GELU's erf, which is closer to the true values than CPU's, move a
    # weight whose gradient is near 0 by up to 3e-5 in 5 steps.)
    for p, rp in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), rp.detach(), rtol=1e-4, atol=1e-4)
    for s in per_step[2:]:  # steps 0-1: compiles, first sighting op by op
        assert s["executions"] == 1 and s["fused_flushes"] == 1, per_step
        assert s["fused_programs_recorded"] >= 3, per_step  # forward, backward, optimizer
        assert s["fused_donated_buffers"] >= 12, per_step  # 4 parameters, exp_avg, exp_avg_sq
        assert s["peak"] <= 8 << 10, per_step  # (the loss, step counts, scalar packs)
    assert per_step[0]["peak"] >= 128 << 10, per_step  # the first, op-by-op sighting


# ---- pipelined flushes: a repeating trace flushed for a value computed early is cut after it ----

def reasons(m0, m1):
    r0 = m0["fused_flushes_by_reason"]
    return {k: v - r0.get(k, 0) for k, v in m1["fused_flushes_by_reason"].items() if v - r0.get(k, 0)}


def test_pipelined_training_step_matches_cpu_and_reads_wait_for_nothing():
    """The GPT's step reads its loss after the optimizer step: from its 3rd
    step the trace is cut after the loss, the rest launched at the read (not
    waited for). Losses equal CPU's (and the unpipelined run's)."""
    import models

    cpu = models.train("gpt", "cpu", 8)
    per_step = []
    prev = [None]

    def on_step(step, loss):
        loss.item()
        m = torch_pjrt.metrics()
        if prev[0] is not None:
            per_step.append(reasons(prev[0], m))
        prev[0] = m

    m0 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=True):
        piped = models.train("gpt", "tpu", 8, on_step=on_step)
    m1 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=False):
        whole = models.train("gpt", "tpu", 8)
    torch.testing.assert_close(torch.tensor(piped), torch.tensor(cpu), rtol=1e-5, atol=1e-5)
    # (not bit for bit: XLA fuses the two parts apart, as strict eager's ops are)
    torch.testing.assert_close(torch.tensor(piped), torch.tensor(whole), rtol=1e-6, atol=1e-6)
    assert delta(m0, m1, "fused_pipeline_cuts_learned") >= 1
    # Steady steps: the forward part is flushed at the cut, the rest at the
    # loss read; the read itself needs no flush.
    for r in per_step[-3:]:
        assert r == {"pipeline": 2}, per_step


def test_pipeline_off_keeps_one_trace_per_step():
    import models

    C = torch_pjrt._state.C
    was = C.set_fused_pipeline(True)
    try:
        m0 = torch_pjrt.metrics()
        with torch_pjrt.fused(pipeline=False):
            models.train("gpt", "tpu", 6, on_step=lambda s, l: l.item())
        m1 = torch_pjrt.metrics()
        assert C.set_fused_pipeline(True) is True  # the region restored the setting
    finally:
        C.set_fused_pipeline(was)
    r = reasons(m0, m1)
    assert "pipeline" not in r and r.get("host_read", 0) >= 6, r
    with pytest.raises(TypeError, match="pipeline must be a bool"):
        torch_pjrt.fused(pipeline="no")


def _cut_step(base, state, idx, index_before_cut=False):
    """Reads v (computed by the first ~21 ops); ~22 ops after it write `state`.
    One op indexes with `idx`: after the cut, or (`index_before_cut`) before
    it, where v reads through it."""
    x = base.clone()
    if index_before_cut:
        x = x.index_select(0, idx)
    for _ in range(10):
        x = x * 1.01 + 0.1
    v = x.sum()
    y = state * 1.0
    for _ in range(10):
        y = y * 0.5 + 1.0
    state.copy_(y if index_before_cut else y.index_select(0, idx))
    return v.item()


def test_pipelined_cut_values_and_a_bad_index_after_the_cut_raises_at_the_next_read():
    torch.manual_seed(0)
    base_c, state_c = torch.randn(8), torch.randn(8)
    good = torch.arange(8).flip(0)
    base, state = tpu(base_c), tpu(state_c)
    idx = tpu(good)
    m0 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=True):
        for _ in range(5):
            got = _cut_step(base, state, idx)
            want = _cut_step(base_c, state_c, good)
            assert got == pytest.approx(want, rel=1e-6)
            assert_same(state, state_c)
        m1 = torch_pjrt.metrics()
        assert delta(m0, m1, "fused_pipeline_cuts_learned") >= 1
        assert reasons(m0, m1).get("pipeline", 0) >= 4
        # A bad index after the cut: this read returns v (which does not
        # depend on it); the next read raises, naming the op.
        bad = tpu(torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
        got = _cut_step(base, state, bad)
        assert got == pytest.approx(_cut_step(base_c, state_c.clone(), good), rel=1e-6)
        with pytest.raises(IndexError, match="index_select"):
            state.sum().item()


def test_a_bad_index_before_the_cut_raises_at_its_read_once_and_the_rest_still_runs():
    # The read raises for the first part's bad index, once; the rest (not
    # launched by the failed read) still runs, and updates state as on CPU
    # (its values do not depend on the index), as strict eager's ops after a
    # bad index do.
    torch.manual_seed(3)
    base_c, state_c = torch.randn(8), torch.randn(8)
    good = torch.arange(8).flip(0)
    base, state, idx = tpu(base_c), tpu(state_c), tpu(good)
    m0 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=True):
        for _ in range(5):
            got = _cut_step(base, state, idx, index_before_cut=True)
            assert got == pytest.approx(_cut_step(base_c, state_c, good, index_before_cut=True), rel=1e-6)
        assert delta(m0, torch_pjrt.metrics(), "fused_pipeline_cuts_learned") >= 1
        bad = tpu(torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
        with pytest.raises(IndexError, match="index_select"):
            _cut_step(base, state, bad, index_before_cut=True)
        _cut_step(base_c, state_c, good, index_before_cut=True)  # the rest's update, on CPU
        assert_same(state, state_c)  # a clean read: the failure was reported once
        for _ in range(3):
            got = _cut_step(base, state, idx, index_before_cut=True)
            assert got == pytest.approx(_cut_step(base_c, state_c, good, index_before_cut=True), rel=1e-6)
        assert_same(state, state_c)


def _two_bad_ops_step(x, w, i):
    """A cut after op 4 (index_select, read below); a second op with the same
    index (embedding, its result unused) after the cut, before the read."""
    s = (w * 0.5 + 1.0) * 2.0
    a = x.index_select(0, i)
    torch.nn.functional.embedding(i, x)
    m = x.masked_fill(x > 0, -1.0)
    c = (w * 0.25).clone()
    h = a.cpu()
    return h, (m.sum() + s.sum() + c.sum()).item()


def test_two_bad_ops_before_a_read_raise_once_as_in_strict_eager():
    # Strict eager's check word keeps the first failure before a read and the
    # read reports it once. Before, the part after the cut kept its own
    # failure (the embedding's), raised at a later, unrelated read.
    torch.manual_seed(6)
    x_c, w_c = torch.randn(8, 16), torch.randn(4, 4)
    good = torch.arange(8).flip(0)
    x, w, idx = tpu(x_c), tpu(w_c), tpu(good)
    bad = tpu(torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
    want = _two_bad_ops_step(x_c, w_c, good)
    for pipeline in (True, False, None):  # None: strict eager
        with torch_pjrt.fused(pipeline=pipeline) if pipeline is not None else contextlib.nullcontext():
            m0 = metrics()
            for _ in range(5):
                h, v = _two_bad_ops_step(x, w, idx)
                torch.testing.assert_close(h, want[0], rtol=0, atol=0)
                assert v == pytest.approx(want[1], rel=1e-5)
            if pipeline:
                assert reasons(m0, metrics()).get("pipeline", 0) >= 3, reasons(m0, metrics())
            with pytest.raises(IndexError, match="index_select"):
                _two_bad_ops_step(x, w, bad)
            assert_same(x.sum(), x_c.sum())  # an unrelated read: nothing more to report
            h, v = _two_bad_ops_step(x, w, idx)
            torch.testing.assert_close(h, want[0], rtol=0, atol=0)
        assert_same(w, w_c)


def _end_read_step(base, idx_a, idx_b):
    """23 ops whose last one computes the value read: index_select with
    idx_a is op 2 (in the first part once split), with idx_b op 22 (in the
    last part)."""
    x = base.clone().index_select(0, idx_a)
    for _ in range(10):
        x = x * 1.01 + 0.1
    return x.index_select(0, idx_b).sum().item()


def test_a_trace_read_at_its_end_is_split_and_checks_keep_their_read():
    torch.manual_seed(2)
    base_c = torch.randn(8)
    good = torch.arange(8).flip(0)
    base, idx = tpu(base_c), tpu(good)
    want = _end_read_step(base_c, good, good)
    m0 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=True):
        for _ in range(5):
            assert _end_read_step(base, idx, idx) == pytest.approx(want, rel=1e-6)
        m1 = torch_pjrt.metrics()
        assert delta(m0, m1, "fused_pipeline_cuts_learned") >= 1
        # From the 3rd step on: the first part flushed at the split, the last
        # at the read.
        assert reasons(m0, m1).get("pipeline", 0) >= 3, reasons(m0, m1)
        # A bad index raises at this read, in either part (the read waits for
        # the last part, so its checks are not deferred).
        bad = tpu(torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
        with pytest.raises(IndexError, match="index_select"):
            _end_read_step(base, bad, idx)
        with pytest.raises(IndexError, match="index_select"):
            _end_read_step(base, idx, bad)
        assert _end_read_step(base, idx, idx) == pytest.approx(want, rel=1e-6)
    with torch_pjrt.fused(pipeline=False):
        m2 = torch_pjrt.metrics()
        for _ in range(3):
            assert _end_read_step(base, idx, idx) == pytest.approx(want, rel=1e-6)
        assert "pipeline" not in reasons(m2, torch_pjrt.metrics())


def _long_end_read_step(base, idx, at, mid=0):
    """43 ops whose last one computes the value read (split by default at 0.5
    and 0.85 of them: parts of 21, 15 and 7 ops); `idx` indexes after
    2*at+1 ops. `mid`: tanh ops inserted after op 27 (a trace that leaves the
    planned chain in its second part)."""
    x = base.clone()
    for i in range(20):
        if i == at:
            x = x.index_select(0, idx)
        if i == 13:
            for _ in range(mid):
                x = torch.tanh(x)
        x = x * 1.01 + 0.1
    return x.sum().item()


def _long_inputs(seed):
    """(base, good index) on CPU and on tpu."""
    torch.manual_seed(seed)
    base_c, good = torch.randn(8), torch.arange(8).flip(0)
    return base_c, good, tpu(base_c), tpu(good)


def test_a_long_trace_read_at_its_end_is_split_into_three_parts_a_bad_index_in_any_raises_at_the_read():
    base_c, good, base, idx = _long_inputs(4)
    with torch_pjrt.fused(pipeline=True):
        for _ in range(3):  # learns the cut (2nd sighting), then compiles the parts
            _long_end_read_step(base, idx, 3)
        m0 = metrics()
        for _ in range(3):
            assert _long_end_read_step(base, idx, 3) == pytest.approx(_long_end_read_step(base_c, good, 3), rel=1e-5)
        m1 = metrics()
        # Each step runs as 3 parts: 2 flushed at the cuts, the last at the read.
        assert reasons(m0, m1) == {"pipeline": 6, "host_read": 3}, reasons(m0, m1)
        bad = tpu(torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
        for at in (3, 12, 19):
            for _ in range(2):  # a trace seen before, cut as planned
                _long_end_read_step(base, idx, at)
            with pytest.raises(IndexError, match="index_select"):
                _long_end_read_step(base, bad, at)
            assert _long_end_read_step(base, idx, at) == pytest.approx(
                _long_end_read_step(base_c, good, at), rel=1e-5)


def test_a_trace_that_leaves_the_planned_chain_is_not_cut_there_and_stays_right():
    # Same first 27 ops, then 3 tanh: the first cut (at 21) is made, the
    # planned second one (15 ops later) is not, as that part's hash there
    # (taken at its first sighting) differs; values are CPU's.
    base_c, good, base, idx = _long_inputs(5)
    with torch_pjrt.fused(pipeline=True):
        for _ in range(4):
            _long_end_read_step(base, idx, 3)
        _long_end_read_step(base, idx, 3, mid=3)
        m0 = metrics()
        for _ in range(2):
            got = _long_end_read_step(base, idx, 3, mid=3)
            assert got == pytest.approx(_long_end_read_step(base_c, good, 3, mid=3), rel=1e-5)
        assert reasons(m0, metrics()) == {"pipeline": 2, "host_read": 2}, reasons(m0, metrics())
        assert _long_end_read_step(base, idx, 3) == pytest.approx(_long_end_read_step(base_c, good, 3), rel=1e-5)


def test_fused_splits_setting_is_checked():
    code = ("import torch, torch_pjrt\n"
            "x = torch.ones(8, device='tpu')\n"
            "with torch_pjrt.fused(pipeline=True):\n"
            "    for _ in range(4):\n"
            "        y = x\n"
            "        for _ in range(20):\n"
            "            y = y * 1.01 + 0.1\n"
            "        y.sum().item()\n")
    env = dict(os.environ, TORCH_PJRT_FUSED_SPLITS="0.9,0.5")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "TORCH_PJRT_FUSED_SPLITS=0.9,0.5" in r.stderr, r.stderr[-2000:]
    env["TORCH_PJRT_FUSED_SPLITS"] = "0.5"
    r = subprocess.run([sys.executable, "-c", code + "print(torch_pjrt.metrics()['fused_flushes_by_reason'])\n"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "'pipeline'" in r.stdout, r.stderr[-2000:]


def _short_step(base, state, before):
    """Reads v after `before` pairs of ops (plus a clone and a sum); 6 ops after it write `state`."""
    x = base.clone()
    for _ in range(before):
        x = x * 1.01 + 0.1
    v = x.sum()
    y = state * 1.0
    for _ in range(2):
        y = y * 0.5 + 1.0
    state.copy_(y)
    return v.item()


@pytest.mark.parametrize("before,cut", [(1, True), (0, False)])
def test_a_short_trace_is_cut_where_both_parts_have_four_ops(before, cut):
    # (A small model's step, like the benchmarks' MLP, gains from its cut: the
    # extra launch is made by the launch thread.)
    torch.manual_seed(1)
    base_c, state_c = torch.randn(8), torch.randn(8)
    base, state = tpu(base_c), tpu(state_c)
    m0 = torch_pjrt.metrics()
    with torch_pjrt.fused(pipeline=True):
        for _ in range(5):
            assert _short_step(base, state, before) == pytest.approx(_short_step(base_c, state_c, before), rel=1e-6)
            assert_same(state, state_c)
        m1 = torch_pjrt.metrics()
    assert (delta(m0, m1, "fused_pipeline_cuts_learned") >= 1) == cut
    assert (reasons(m0, m1).get("pipeline", 0) >= 4) == cut


def _narrow_then_wide(a, b):
    # Each bf16 result is rounded to bf16 before it is widened (as PyTorch
    # does op by op), also inside one fused program.
    out = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    out.copy_(a * b)
    return [(a * b).float(), (a / b).float(), (a + b).float() * 1.0, out,
            torch.addcdiv(a.float(), a, b, value=0.5)]


def _mask_times(a, b):
    m = (a > 0).float()  # a converted mask, multiplied by the next op
    return m * b, b * (a > 0).to(b.dtype), (m * b).sum()


def test_a_converted_mask_times_nan_is_nan_inside_a_fused_program():
    # XLA rewrites convert(pred) * y into select(pred, y, 0), which gave 0
    # where CPU gives 0 * nan = nan (and 0 * inf = nan) once the convert and
    # the multiply were in one program.
    a = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.0, 3.0])
    b = torch.tensor([float("nan"), float("nan"), float("inf"), float("-inf"), 5.0, 1.0])
    want = _mask_times(a, b)
    at, bt = tpu(a), tpu(b)
    m0 = metrics()
    for _ in range(3):  # op by op, then the compiled trace twice
        with torch_pjrt.fused(pipeline=False):
            got = _mask_times(at, bt)
            for g, w in zip(got, want):
                assert torch.equal(g.cpu().isnan(), w.isnan()) and torch.equal(g.cpu().nan_to_num(), w.nan_to_num())
    assert delta(m0, metrics(), "fused_cache_hits") >= 1
    compiled = torch.compile(_mask_times, backend="tpu")
    for g, w in zip(compiled(at, bt), want):
        assert torch.equal(g.cpu().isnan(), w.isnan()) and torch.equal(g.cpu().nan_to_num(), w.nan_to_num())


def test_bf16_results_are_rounded_inside_a_fused_program():
    a = make((64,), seed=6).bfloat16()
    b = make((64,), seed=7).bfloat16()
    want = _narrow_then_wide(a, b)
    at, bt = tpu(a), tpu(b)
    m0 = metrics()
    for _ in range(3):  # op by op, then the compiled trace twice
        with torch_pjrt.fused():
            got = _narrow_then_wide(at, bt)
        for g, w in zip(got, want):
            assert torch.equal(g.cpu(), w)
    assert delta(m0, metrics(), "fused_cache_hits") >= 1
    # A compiled graph too (not addcdiv: its decomposition divides in bf16).
    compiled = torch.compile(_narrow_then_wide, backend="tpu")
    for g, w in list(zip(compiled(at, bt), want))[:4]:
        assert torch.equal(g.cpu(), w)


def test_a_repeated_trace_reuses_its_uploaded_offsets_and_scalars_only_while_they_match():
    # A fused program's view offsets and float scalars are runtime inputs,
    # uploaded once per flush unless they equal the last flush's of that
    # program. Offsets and scalars that change (in any order, back to
    # earlier values) must give CPU's values; repeats upload nothing.
    base_c = make((64,), seed=3)
    base = tpu(base_c)

    def step(b, i, s):
        return (b[i:i + 8] * s + b[i + 1:i + 9]).sum()

    plan = [(0, 0.5), (0, 0.5), (8, 0.5), (8, 2.0), (0, 0.5), (16, 0.5), (16, 0.5), (0, 2.0), (0, 2.0)] * 3
    with torch_pjrt.fused():
        for i, s in plan[:4]:  # the trace compiles its fused program
            step(base, i, s).item()
        for i, s in plan:
            want = step(base_c, i, s).item()
            assert step(base, i, s).item() == pytest.approx(want, rel=1e-6), (i, s)
        step(base, 16, 0.5).item()  # (its packs differ from the last step's: uploaded once)
        m0 = torch_pjrt.metrics()
        for _ in range(20):
            assert step(base, 16, 0.5).item() == pytest.approx(step(base_c, 16, 0.5).item(), rel=1e-6)
        m1 = torch_pjrt.metrics()
        # Scalars equal under == but not bitwise: -0.0 after 0.0 is a new pack.
        ones = tpu(torch.ones(4))
        for s in (0.0, 0.0, -0.0, 0.0, -0.0, -0.0):
            got = (1.0 / (ones * s)).sum().item()
            assert got == (1.0 / (torch.ones(4) * s)).sum().item(), s
    assert delta(m0, m1, "fused_cache_hits") >= 19
    assert delta(m0, m1, "host_to_device_bytes") == 0


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two devices")
def test_reused_packs_follow_the_device_a_trace_runs_on():
    # One fused program serves the same trace on every device: its kept packs
    # (on the device of the run that uploaded them) must not be handed to a
    # run on another device, which uploads its own. (The CPU plugin's devices
    # share host memory and accept each other's buffers; a GPU plugin's do not.)
    base_c = make((64,), seed=4)
    on = {dev: base_c.to(dev) for dev in ("tpu:0", "tpu:1")}

    def step(b, i):
        return (b[i:i + 8] * 0.5 + b[i + 1:i + 9]).sum()

    with torch_pjrt.fused():
        for rep in range(3):
            for dev in ("tpu:0", "tpu:1", "tpu:0"):
                for i in (0, 8, 8):
                    got = step(on[dev], i)
                    assert got.device == torch.device(dev)
                    assert got.item() == pytest.approx(step(base_c, i).item(), rel=1e-6), (rep, dev, i)


def test_a_long_trace_in_a_tight_loop_is_not_compiled_at_its_second_sighting():
    """Thousands of single-row writes in a Python loop flush at the size bound
    with one structure each time: XLA took 80 s to compile such a trace, which
    runs op by op in about 0.1 s. Over TORCH_PJRT_FUSED_HOT_OPS ops (512) a
    repeating trace waits until its op-by-op runs have cost its expected compile."""
    x = torch.zeros(700, 4, 3, device="tpu")
    src = torch.rand(4200, 4, 3, device="tpu")
    rows = torch.randint(700, (4200,)).tolist()  # two size-bound traces of one structure
    expected = x.cpu().clone()
    src_cpu = src.cpu()
    m0 = metrics()
    with torch_pjrt.fused():
        for i, r in enumerate(rows):
            x[r, :, :] = src[i, :, :]
            expected[r, :, :] = src_cpu[i, :, :]
    m1 = metrics()
    assert_same(x, expected)
    assert delta(m0, m1, "fused_flushes") >= 2
    assert m1["fused_max_ops_per_flush"] > 512
    assert delta(m0, m1, "fused_programs_compiled") == 0
    assert delta(m0, m1, "fused_deferred_compiles") >= 1


def test_unbalanced_region_exit_is_refused_and_regions_still_work():
    # A stray exit took the region count below zero: every later region was off.
    with pytest.raises(RuntimeError, match="exit without a matching enter"):
        torch_pjrt.fused().__exit__(None, None, None)
    with torch_pjrt.fused():
        assert torch_pjrt.fused_active()


def test_one_region_object_nested_restores_the_pipeline_setting():
    # Its second enter overwrote the setting to restore: pipeline=False stayed on.
    before = torch_pjrt._state.C.set_fused_pipeline(True)
    torch_pjrt._state.C.set_fused_pipeline(before)
    region = torch_pjrt.fused(pipeline=not before)
    with region:
        with region:
            pass
    assert torch_pjrt._state.C.set_fused_pipeline(before) == before


def test_region_inside_torch_compile_is_silent(recwarn):
    # Dynamo warned that it cannot trace the region's C++ enter; the graph is
    # one program anyway, so the region is a no-op while tracing.
    torch._dynamo.reset()

    def f(x):
        with torch_pjrt.fused():
            y = x * 2 + 1
        return y.sum()
    assert torch.compile(f, backend="tpu")(tpu(torch.ones(4))).item() == 12.0
    assert not [w for w in recwarn if "Dynamo does not know how to trace" in str(w.message)]
