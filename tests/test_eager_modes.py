"""TORCH_PJRT_EAGER=async (default) and debug; runtime scalars; _foreach_ ops."""

import pytest
import torch

import torch_pjrt

from conftest import assert_same, make, tpu, run_python

WAITS = (
    "import torch, torch_pjrt\n"
    "x = torch.ones(64, device='tpu')\n"
    "torch.tpu.synchronize()\n"
    "w0 = torch_pjrt.metrics()['host_waits']\n"
    "for _ in range(5):\n"
    "    x = x * 2 + 1\n"
    "print('waits', torch_pjrt.metrics()['host_waits'] - w0)\n")


def test_async_mode_does_not_wait_per_op():
    r = run_python(WAITS, TORCH_PJRT_EAGER="async")
    assert r.returncode == 0, r.stderr
    assert "waits 0" in r.stdout


def test_debug_mode_waits_after_every_op():
    r = run_python(WAITS, TORCH_PJRT_EAGER="debug")
    assert r.returncode == 0, r.stderr
    assert "waits 10" in r.stdout  # 5 x (mul, add)


OOB = (
    "import torch, torch_pjrt\n"
    "x = torch.arange(5.0, device='tpu')\n"
    "i = torch.tensor([0, 7], device='tpu')\n"
    "def step():\n"
    "    return torch.index_select(x, 0, i)  # the faulty line\n"
    "try:\n"
    "    y = step()\n"
    "    print('no error', y.cpu().tolist())\n"
    "except IndexError as e:\n"
    "    import traceback\n"
    "    print('IndexError', e)\n"
    "    frame = traceback.extract_tb(e.__traceback__)[-1]\n"
    "    print('at', frame.name, frame.lineno)\n")


def test_debug_mode_reports_out_of_range_index_at_the_op():
    r = run_python(OOB, TORCH_PJRT_EAGER="debug")
    assert r.returncode == 0, r.stderr
    assert "IndexError" in r.stdout and "index_select" in r.stdout and "out of range" in r.stdout
    assert "at step 5" in r.stdout  # the Python line of the faulty op


def test_async_mode_reports_value_checks_at_the_next_read():
    # The check runs in the op's program; the host read that follows raises
    # (the traceback points at the read, as with CUDA's device-side asserts).
    r = run_python(OOB, TORCH_PJRT_EAGER="async")
    assert r.returncode == 0, r.stderr
    assert "IndexError" in r.stdout and "index_select" in r.stdout and "asynchronously" in r.stdout
    assert "at <module> 8" in r.stdout  # the y.cpu() line


def test_bad_eager_mode_is_rejected():
    r = run_python("import torch, torch_pjrt\nprint((torch.ones(2, device='tpu') + 1).cpu())\n",
                   TORCH_PJRT_EAGER="lazy")
    assert r.returncode != 0 and "TORCH_PJRT_EAGER must be 'async' or 'debug'" in r.stderr


def test_changing_float_scalars_do_not_recompile(metrics_delta):
    x, y = tpu(make((8,))), tpu(make((8,), seed=1))
    x.add(y, alpha=0.5) * 0.25  # compile once
    # Op programs built: executable-cache misses (an XLA compile or a load from
    # the persistent cache). Fused eager may compile the repeating two-op
    # trace once, too (its own cache, counted apart).
    op_programs = lambda d: d["executable_cache_misses"]  # noqa: E731
    before = metrics_delta()
    for lr in (0.1, 0.01, 0.003, 1e-4):
        r = x.add(y, alpha=-lr) * lr
        assert_same(r, (x.cpu().add(y.cpu(), alpha=-lr)) * lr)
    after = metrics_delta()
    assert op_programs(after) == op_programs(before)
    assert after["fused_programs_compiled"] - before["fused_programs_compiled"] <= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_ops_match_cpu(dtype, metrics_delta):
    cpu_p = [make((3, 4), dtype=dtype), make((5,), dtype=dtype), make((2, 2, 2), dtype=dtype)]
    cpu_g = [make(p.shape, dtype=dtype, seed=i + 1) for i, p in enumerate(cpu_p)]
    tp, tg = tpu(cpu_p), tpu(cpu_g)
    for params, grads in ((cpu_p, cpu_g), (tp, tg)):
        torch._foreach_mul_(params, 0.9)
        torch._foreach_add_(params, grads, alpha=-0.1)
        torch._foreach_add_(params, [0.1, 0.2, 0.3])
    assert_same(list(tp), cpu_p)
    assert_same(torch._foreach_norm(tp), torch._foreach_norm(cpu_p))
    assert_same(torch._foreach_sqrt(torch._foreach_abs(tp)), torch._foreach_sqrt(torch._foreach_abs(cpu_p)))
    assert_same(torch._foreach_maximum(tp, tg), torch._foreach_maximum(cpu_p, cpu_g))
    assert metrics_delta()["cpu_fallbacks"] == {}


@pytest.mark.strict_eager
def test_foreach_is_one_program_per_call(metrics_delta):
    ps = [tpu(make((4,))) for _ in range(6)]
    gs = [tpu(make((4,))) for _ in range(6)]
    torch._foreach_add_(ps, gs, alpha=0.5)
    before = metrics_delta()["executions"]
    torch._foreach_add_(ps, gs, alpha=0.25)
    assert metrics_delta()["executions"] - before == 1


def test_debug_mode_checks_embedding_token_ids():
    # A token id past the vocabulary: CPU raises IndexError; so does debug mode.
    code = ("import torch, torch_pjrt\n"
            "emb = torch.nn.Embedding(10, 4).to('tpu')\n"
            "try:\n"
            "    emb(torch.tensor([[1, 12]], device='tpu'))\n"
            "    print('no error')\n"
            "except IndexError as e:\n"
            "    print('IndexError', e)\n")
    r = run_python(code, TORCH_PJRT_EAGER="debug")
    assert r.returncode == 0, r.stderr
    assert "IndexError" in r.stdout and "embedding" in r.stdout and "out of range" in r.stdout


def test_training_loop_builds_no_program_after_the_first_steps():
    # AdamW's bias corrections and the lr change every step and reach the
    # _foreach_ ops as float lists: runtime inputs, never a program per value.
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import models
    import torch_pjrt
    misses = []
    models.train("gpt", "tpu", 6, on_step=lambda step, loss: misses.append(
        torch_pjrt.metrics()["executable_cache_misses"]))
    assert misses[2] == misses[-1], misses
    modes = torch_pjrt._state.C.float_modes()
    for op in ("aten::_foreach_div_.ScalarList", "aten::_foreach_addcdiv_.ScalarList", "aten::_foreach_mul_.Scalar"):
        assert modes.get(op, "runtime") == "runtime", (op, modes.get(op))


def test_execute_floor_times_a_program_and_rejects_views():
    # The launch-floor probe of benchmarks/fused_eager.py: a positive time per
    # call for a valid program; a view argument is refused with ValueError.
    import torch_pjrt
    text = """module @floor {
  func.func public @main(%a: tensor<4xf32>) -> (tensor<4xf32>) {
    "func.return"(%a) : (tensor<4xf32>) -> ()
  }
}
"""
    x = torch.ones(4, device="tpu")
    assert 0 < torch_pjrt._state.C.execute_floor(text, [x], 10) < 1.0
    base = torch.ones(8, device="tpu")
    with pytest.raises(ValueError, match="whole contiguous tpu tensors"):
        torch_pjrt._state.C.execute_floor(text, [base[2:6]], 10)


def test_time_program_chain_feeds_each_calls_outputs_to_the_next():
    # benchmarks/capture_vs_jax.py runs JAX's step program this way: aliased
    # inputs donated, outputs fed back. After 5 calls of (x + 1, x * y) the
    # arguments hold CPU's values of 5 steps; an out-of-range alias raises
    # before any call.
    import torch_pjrt
    text = """module @chain {
  func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 1 : i32}, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %n = "stablehlo.add"(%x, %one) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %p = "stablehlo.multiply"(%x, %y) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%p, %n) : (tensor<4xf32>, tensor<4xf32>) -> ()
  }
}
"""
    x0 = torch.tensor([0.5, -1.0, 2.0, 3.0])
    y = torch.tensor([2.0, 3.0, -1.0, 0.5])
    x, yt = x0.to("tpu"), y.to("tpu")
    times = torch_pjrt._state.C.time_program_chain(text, [x, yt], [(0, 1)], 5)
    assert len(times) == 5 and all(t > 0 for t in times)
    torch.testing.assert_close(x.cpu(), x0 + 5)
    torch.testing.assert_close(yt.cpu(), y)
    with pytest.raises(IndexError, match="output 7 out of range"):
        torch_pjrt._state.C.time_program_chain(text, [x, yt], [(0, 7)], 1)
    torch.testing.assert_close(x.cpu(), x0 + 5)  # checked before any call: nothing donated


@pytest.mark.parametrize("env,message", [
    # Each was read at its first use (a bad value raised at some later op) or
    # misread (0 devices gave the default 2; "1.5" became a 1-byte limit).
    ({"TORCH_PJRT_FALLBACK": "bogus"}, "TORCH_PJRT_FALLBACK must be 'cpu' or 'error'"),
    ({"TORCH_PJRT_FUSED_COMPILE": "bogus"}, "TORCH_PJRT_FUSED_COMPILE must be 'auto' or 'second'"),
    ({"TORCH_PJRT_CPU_DEVICES": "abc"}, "TORCH_PJRT_CPU_DEVICES must be a whole number >= 1"),
    ({"TORCH_PJRT_CPU_DEVICES": "0"}, "TORCH_PJRT_CPU_DEVICES must be a whole number >= 1"),
    ({"TORCH_PJRT_MEMORY_LIMIT": "1.5"}, "TORCH_PJRT_MEMORY_LIMIT must be bytes"),
])
def test_bad_settings_fail_the_import(env, message):
    r = run_python("import torch, torch_pjrt\nprint((torch.ones(2, device='tpu') + 1).cpu())\n", **env)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]


def test_unknown_log_topic_is_named():
    r = run_python("import torch, torch_pjrt\nprint((torch.ones(2, device='tpu') + 1).cpu())\n",
                   TORCH_PJRT_LOG="recompiles,bogus")
    assert r.returncode == 0 and "TORCH_PJRT_LOG names unknown topics ['bogus']" in r.stderr, r.stderr


def test_python_settings_check_their_arguments():
    with pytest.raises(TypeError, match="must be a bool"):
        torch_pjrt.set_checks("off")  # (bool("off") turned the checks on)
    assert torch_pjrt.checks_enabled()
    with pytest.raises(TypeError, match="whole number of bytes"):
        torch_pjrt.set_memory_limit(1.5)  # (a 1-byte limit before)
    try:
        torch_pjrt.set_memory_limit("1G")  # (as the env variable and the cache CLI read sizes)
        assert torch_pjrt.memory_limit(0) == 1 << 30
    finally:
        torch_pjrt.set_memory_limit(0)
    with pytest.raises(ValueError, match="not a size"):
        torch_pjrt.set_memory_limit("1.5x")
