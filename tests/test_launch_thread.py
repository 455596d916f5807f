"""The launch thread (csrc/runtime/launcher.cpp): executions queued with
Runtime::launch are made by one thread, their outputs pending until then.
Values must equal those of the same work launched on the calling thread (and
CPU's), every reader must wait for a pending output, memory must count it from
the call, and a launch that fails must raise at the read of its outputs or at
the next synchronize: never hang, crash or hand back garbage."""
import contextlib
import gc
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt

C = torch_pjrt._state.C

ADD = """module @add {
  func.func public @main(%a: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
}
"""


@pytest.fixture
def launch_thread_on():
    was = C.async_launch_enabled()
    C.set_async_launch(True)
    yield
    C.set_async_launch(was)


def _train(steps, on_launch_thread):
    """A captured AdamW step (replayed from its 4th call) on a small MLP; the
    losses and final parameters, read back without a synchronize in between."""
    C.set_async_launch(on_launch_thread)
    gc.collect()  # an earlier call's model and recordings
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

    @torch_pjrt.capture_step
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]
    # No read until the end. Launches are counted over the replays only (from
    # the 4th call): the warm-up call runs as fused eager, where a pipelined
    # cut learned earlier in the process for the same trace adds a launch.
    losses = [step(x.to("tpu"), y.to("tpu")) for x, y in batches[:3]]
    m0 = torch_pjrt.metrics()
    losses += [step(x.to("tpu"), y.to("tpu")) for x, y in batches[3:]]
    m1 = torch_pjrt.metrics()
    torch.tpu.synchronize()
    allocated = torch.tpu.memory_allocated() - base
    return ([l.cpu() for l in losses], [p.detach().cpu() for p in model.parameters()], allocated,
            m1["async_launches"] - m0["async_launches"], m1["capture_replays"] - m0["capture_replays"])


def test_replays_on_the_launch_thread_equal_replays_on_the_calling_thread(launch_thread_on):
    _train(12, on_launch_thread=False)  # warms the process's program caches for both runs below
    losses_a, params_a, mem_a, launched_a, replays_a = _train(12, on_launch_thread=True)
    losses_s, params_s, mem_s, launched_s, replays_s = _train(12, on_launch_thread=False)
    assert replays_a == replays_s == 9  # warm-up, two recordings, then replays
    # Replaced buffers are let go (on the launch thread): the same device
    # memory either way once the work is done.
    assert mem_a == mem_s
    assert launched_a == replays_a, "each replay is queued on the launch thread"
    assert launched_s == 0
    for a, s in zip(losses_a + params_a, losses_s + params_s):
        torch.testing.assert_close(a, s, rtol=0, atol=0)  # the same program on the same inputs: bitwise


def test_a_pending_output_is_read_after_its_launch(launch_thread_on):
    x = torch.arange(4, dtype=torch.float32).to("tpu")
    assert C.launch_program(ADD, [x], False) == 1
    assert C.launch_program(ADD, [x], True) == 1  # the read waits for the launch, no error
    torch.tpu.synchronize()


def test_a_failed_launch_raises_at_its_read_then_the_device_keeps_working(launch_thread_on):
    bad = torch.ones(8, device="tpu")  # the program takes 4 floats
    with pytest.raises(RuntimeError, match="execute failed.*expected parameter 0"):
        C.launch_program(ADD, [bad], True)
    torch.tpu.synchronize()  # raised at the read: not again here
    x = torch.ones(4, device="tpu")
    torch.testing.assert_close((x + 1).cpu(), torch.full((4,), 2.0))


def test_a_failed_launch_nobody_reads_raises_at_the_next_synchronize_once(launch_thread_on):
    bad = torch.ones(8, device="tpu")
    C.launch_program(ADD, [bad], False)
    with pytest.raises(RuntimeError, match="execute failed"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()  # reported once
    x = torch.ones(4, device="tpu")
    assert C.launch_program(ADD, [x], True) == 1


def test_execute_floor_on_the_launch_thread_times_the_callers_side(launch_thread_on):
    x = torch.ones(4, device="tpu")
    assert 0 < C.execute_floor(ADD, [x], 50, on_launch_thread=True) < 1.0
    torch.testing.assert_close((x * 3).cpu(), torch.full((4,), 3.0))


def test_a_process_that_exits_with_launches_queued_exits_cleanly():
    # Work still queued for the launch thread at exit (no synchronize): the
    # interpreter's shutdown must neither hang nor crash nor print errors.
    code = ("import torch, torch_pjrt\n"
            "x = torch.randn(128, 128, device='tpu')\n"
            "for _ in range(100):\n"
            "    x = torch.tanh(x @ x) * 0.5\n")
    env = dict(os.environ, TORCH_PJRT_ASYNC_LAUNCH="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Error" not in r.stderr and "terminate" not in r.stderr, r.stderr


@pytest.mark.parametrize("fused", [False, True], ids=["strict", "fused"])
def test_back_to_back_replays_donate_what_queued_work_still_reads(launch_thread_on, fused):
    # Replays queued one after another, with no read in between: each donates
    # the state the previous replay made (still held by that queued or running
    # execution) and waits for no launch, while strict ops queued before each
    # replay read the values from before it (PJRT orders a donation after the
    # buffer's earlier uses). In a fused region those ops are a trace, flushed
    # before each replay: launched by the launch thread too, not an execute
    # call on the caller that waits for the replay queued before it.
    n = 128
    gen = torch.Generator().manual_seed(5)
    p_cpu, g_cpu = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen) * 0.1
    p, g = p_cpu.to("tpu"), g_cpu.to("tpu")

    @torch_pjrt.capture_step
    def step(g):
        p.mul_(0.5).add_(g)
        return p.sum()

    def step_cpu():
        p_cpu.mul_(0.5).add_(g_cpu)
        return p_cpu.sum()

    for _ in range(5):  # warm-up, two recordings, a first replay
        step(g).item()
        step_cpu()
    torch.tpu.synchronize()
    m0 = torch_pjrt.metrics()
    reads, sums, reads_cpu, sums_cpu = [], [], [], []
    with torch_pjrt.fused() if fused else contextlib.nullcontext():
        for _ in range(8):
            reads.append(torch.tanh(p @ p))  # queued on the launch thread (strict) or recorded (fused)
            sums.append(step(g))
            reads_cpu.append(torch.tanh(p_cpu @ p_cpu))
            sums_cpu.append(step_cpu())
    m1 = torch_pjrt.metrics()
    if fused:
        assert m1["fused_flushes_by_reason"].get("capture", 0) - m0["fused_flushes_by_reason"].get("capture", 0) >= 8
    torch.tpu.synchronize()
    assert m1["capture_replays"] - m0["capture_replays"] == 8
    assert m1["fused_donated_buffers"] - m0["fused_donated_buffers"] == 8, "p donated by every replay"
    assert m1["fused_not_donated_buffers"] == m0["fused_not_donated_buffers"]
    assert m1["launch_waits"] - m0["launch_waits"] <= 1, "a replay waited for an earlier launch"
    for a, b in zip(reads + sums + [p], reads_cpu + sums_cpu + [p_cpu]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-4)
