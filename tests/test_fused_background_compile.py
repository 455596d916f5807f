"""Fused eager's programs compiled on compile threads
(TORCH_PJRT_FUSED_BACKGROUND_COMPILE): a trace due to compile runs op by op
while its program compiles, then switches to it, with CPU's values
throughout. `auto` (the users' default) does so for traces that earned their
compile by rent or buy (back only after many others), `all` also for tight
loops, `off` for none. Each case runs in a fresh process with the persistent
cache off, so that a compile takes XLA's time and the switch happens
mid-run (the rest of the suite runs with `off`: tests/conftest.py)."""
import json

import pytest

from conftest import FUSED, run_json, run_python

pytestmark = pytest.mark.skipif(FUSED, reason="runs its own fused regions in fresh processes")

TRAIN = """
import json, sys, time, torch, torch_pjrt
sys.path.insert(0, "examples")
import models
steps = {steps}
cpu = models.train("gpt", "cpu", steps)
with torch_pjrt.fused():
    tpu = models.train("gpt", "tpu", steps, on_step=lambda s, loss: loss.item())
    # The same steps again until the programs are in use (bounded by time).
    end = time.time() + 120
    while torch_pjrt.metrics()["fused_cache_hits"] == 0 and time.time() < end:
        models.train("gpt", "tpu", 2)
    again = models.train("gpt", "tpu", steps, on_step=lambda s, loss: loss.item())
print("RESULT " + json.dumps({{"cpu": cpu, "tpu": tpu, "again": again, "m": {{
    k: v for k, v in torch_pjrt.metrics().items() if k.startswith("fused") and not isinstance(v, dict)}}}}))
"""


def test_training_runs_op_by_op_while_its_programs_compile_then_switches():
    steps = 10
    r = run_json(TRAIN.format(steps=steps), TORCH_PJRT_FUSED_BACKGROUND_COMPILE="all", TORCH_PJRT_CACHE_DIR="")
    import torch
    # CPU's losses before, across and after the switch to the fused programs.
    torch.testing.assert_close(torch.tensor(r["tpu"]), torch.tensor(r["cpu"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(r["again"]), torch.tensor(r["cpu"]), rtol=1e-5, atol=1e-5)
    m = r["m"]
    # Sightings ran op by op while the programs compiled (a compile takes
    # XLA tens of milliseconds at least; the sighting that starts it is one).
    assert m["fused_runs_while_compiling"] >= 1, m
    # ... and the programs were then used, each compiled once.
    assert m["fused_cache_hits"] >= steps, m
    assert 1 <= m["fused_programs_compiled"] <= 4, m
    assert m["fused_compile_failures"] == 0, m
    assert m["fused_compile_seconds"] > 0, m


def test_a_tight_loop_gets_its_program_at_once_unless_all():
    """auto and off: a training loop's traces compile on the caller and run
    as programs from the sighting that compiled them (none runs op by op
    waiting for a compile); so does `all` with TORCH_PJRT_COMPILE_THREADS=0."""
    for env in ({"TORCH_PJRT_FUSED_BACKGROUND_COMPILE": "auto"}, {"TORCH_PJRT_FUSED_BACKGROUND_COMPILE": "off"},
                {"TORCH_PJRT_FUSED_BACKGROUND_COMPILE": "all", "TORCH_PJRT_COMPILE_THREADS": "0"}):
        r = run_json(TRAIN.format(steps=6), TORCH_PJRT_CACHE_DIR="", **env)
        assert r["m"]["fused_runs_while_compiling"] == 0, (env, r["m"])
        assert r["m"]["fused_cache_hits"] >= 6, (env, r["m"])


def test_traces_back_after_many_others_compile_on_a_thread():
    """auto: nine traces in a cycle (as each token's trace of a generate call
    whose cache grows, back in the next call) run op by op until that has
    cost about their compiles; their programs then compile on a compile
    thread while they go on op by op, and are used once there. CPU's values
    throughout."""
    r = run_json(r"""
import json, torch, torch_pjrt
m = torch_pjrt.metrics
x = torch.linspace(-2, 2, 16)
def grown(x, n):
    y = torch.cat((x, x[:n] * 2.0)).sin() + 1.0
    return (y * y).sum().item()
sizes = range(2, 11)
want = {n: grown(x, n) for n in sizes}
xt = x.to("tpu")
bad = []
with torch_pjrt.fused():
    grown(xt, 12); grown(xt, 12)  # a tight loop: compiled on the caller (a first measured compile cost)
    c0 = m()["fused_programs_compiled"]
    for rounds in range(20000):
        if m()["fused_programs_compiled"] - c0 >= len(sizes):
            break
        for n in sizes:
            v = grown(xt, n)
            if abs(v - want[n]) > 1e-4 * abs(want[n]):
                bad.append((n, v, want[n]))
    for n in sizes:  # now as programs
        grown(xt, n)
print("RESULT " + json.dumps({"bad": bad, "c0": c0, "rounds": rounds, "m": {
    k: v for k, v in m().items() if k.startswith("fused") and not isinstance(v, dict)}}))
""", TORCH_PJRT_FUSED_BACKGROUND_COMPILE="auto", TORCH_PJRT_CACHE_DIR="")
    m = r["m"]
    assert r["bad"] == [], r["bad"][:5]
    assert r["c0"] == 1, r  # the tight loop's program, on the caller
    assert m["fused_programs_compiled"] == 1 + 9, m
    assert m["fused_runs_while_compiling"] >= 9, m  # (each trace's sighting that starts its compile, at least)
    assert m["fused_cache_hits"] >= 9, m
    assert m["fused_compile_failures"] == 0, m


def test_exit_while_a_fused_program_compiles():
    """The process ends while a training step's fused program is compiling:
    exit waits for it (XLA's static destructors crashed under a compile that
    was still running) and the process ends cleanly."""
    code = """
import json, sys, torch, torch_pjrt
sys.path.insert(0, "examples")
import models
class Stop(Exception):
    pass
def on_step(step, loss):
    loss.item()
    if torch_pjrt.metrics()["fused_runs_while_compiling"] >= 1:
        raise Stop  # (the step's program has just started compiling: it takes XLA seconds)
try:
    with torch_pjrt.fused():
        models.train("gpt", "tpu", 20, on_step=on_step)
except Stop:
    pass
m = torch_pjrt.metrics()
print("RESULT " + json.dumps([m["fused_runs_while_compiling"], m["fused_programs_compiled"]]), flush=True)
"""
    for _ in range(2):
        r = run_python(code, timeout=300, TORCH_PJRT_FUSED_BACKGROUND_COMPILE="all", TORCH_PJRT_CACHE_DIR="")
        assert r.returncode == 0, r.stderr[-3000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        while_compiling, compiled = json.loads(line[len("RESULT "):])
        assert while_compiling >= 1 and compiled == 0, line  # (still compiling when the script ended)


def test_the_setting_is_checked():
    code = """
import torch, torch_pjrt
with torch_pjrt.fused():
    for _ in range(3):
        (torch.ones(2, device='tpu') + 1).cpu()  # (the trace repeats: its program is due)
"""
    r = run_python(code, TORCH_PJRT_FUSED_BACKGROUND_COMPILE="yes")
    assert r.returncode != 0
    assert "TORCH_PJRT_FUSED_BACKGROUND_COMPILE" in r.stderr, r.stderr[-2000:]
