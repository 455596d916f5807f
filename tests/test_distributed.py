"""torch.distributed with backend="tpu" (torch_pjrt/distributed,
csrc/distributed/host_backend.cpp): 2 ranks on the CPU plugin, each rank on
its own tpu device, results checked against the same collectives computed on
CPU here. Each test starts its ranks as separate processes (torchrun,
torch.multiprocessing.spawn, or plain processes) with a bounded timeout."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "fixtures", "dist_worker.py")
WORLD = 2
TIMEOUT = 240


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CPU_DEVICES="2")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _results(out):
    return [json.load(open(out / f"rank{r}.json")) for r in range(WORLD)]


def _check(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def torchrun(scenario, out, backend="tpu", **env):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
         "--master-addr", "127.0.0.1", "--master-port", str(_port()), WORKER, scenario, str(out), backend],
        env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT)
    _check(proc)
    return _results(out)


def spawn(scenario, out, backend="tpu", **env):
    proc = subprocess.run([sys.executable, WORKER, scenario, str(out), backend, str(_port())],
                          env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT)
    _check(proc)
    return _results(out)


def expected_collectives():
    base = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(WORLD)]
    prod = [torch.arange(6, dtype=torch.float32) % 3 + 1 + r for r in range(WORLD)]
    total = base[0] + base[1]
    big = torch.zeros(4, 6)
    big[:, 1] = 3
    per_rank = []
    for r in range(WORLD):
        e = {
            "all_reduce_sum": total, "all_reduce_avg": total / WORLD,
            "all_reduce_max": torch.maximum(*base), "all_reduce_min": torch.minimum(*base),
            "all_reduce_product": prod[0] * prod[1],
            "all_reduce_int64": torch.arange(5) * 3,
            "broadcast": base[1],
            "all_gather": base, "all_gather_into_tensor": torch.cat(base),
            "reduce_scatter": sum(b[:3] * (r + 1) for b in base),
            "reduce_scatter_tensor": total[3 * r:3 * r + 3],
            "all_to_all_single": torch.cat([b[3 * r:3 * r + 3] for b in base]),
            "all_to_all": [b[3 * r:3 * r + 3] for b in base],
            "all_reduce_view": big, "future": total, "cpu_tensor": torch.full((3,), 3.0),
            "all_gather_into_tensor_shapes": torch.cat(base),
            "reduce_scatter_tensor_shapes": total[3 * r:3 * r + 3],
            "all_gather_coalesced": [torch.cat([b[:2] for b in base]), torch.cat([b[2:] for b in base])],
            "reduce_scatter_coalesced": [total[r:r + 1], total[WORLD + 2 * r:WORLD + 2 * r + 2]],
        }
        if r == 1:
            e["recv"] = base[0] * 2
        per_rank.append(e)
    return per_rank


def _assert_collectives(results):
    for r, (got, want) in enumerate(zip(results, expected_collectives())):
        for name, value in want.items():
            values = [v.tolist() for v in value] if isinstance(value, list) else value.tolist()
            assert got[name] == values, f"rank {r} {name}: {got[name]} != {values}"
        kind, text = got["errors"]["size"]
        assert kind == got["errors"]["size_cpu"][0], got["errors"]  # the type gloo raises for CPU tensors
        assert "size" in text, text
        if got["backend"] == "tpu":  # (with "cpu:gloo,tpu:tpu" a CPU output goes to gloo, which refuses a tpu input)
            assert got["errors"]["devices"][0] == "RuntimeError", got["errors"]
            assert "all_gather_into_tensor: tensors on" in got["errors"]["devices"][1], got["errors"]
        else:
            assert got["errors"]["devices"][0] == "RuntimeError", got["errors"]


def test_collectives_under_torchrun(tmp_path):
    results = torchrun("collectives", tmp_path)
    _assert_collectives(results)
    assert all(r["backend"] == "tpu" for r in results)
    m = results[0]["metrics"]
    assert m["distributed_host_collectives"] >= 15 and m["distributed_to_host_bytes"] > 0, m


def test_mixed_backend_string_under_spawn(tmp_path):
    # "cpu:gloo,tpu:tpu": CPU tensors go to gloo itself, tpu tensors to ours.
    results = spawn("collectives", tmp_path, backend="cpu:gloo,tpu:tpu")
    _assert_collectives(results)
    assert results[0]["backend"] == "cpu:gloo,tpu:tpu"


def test_collectives_inside_compiled_graphs(tmp_path):
    results = spawn("compiled", tmp_path)
    x = [torch.arange(4.0) + r for r in range(WORLD)]
    for res in results:
        assert res["functional"] == (2 * (x[0] + x[1]) + 1).tolist()
        assert res["in_place"] == (3 * (x[0] + x[1])).tolist()
        assert res["metrics"]["distributed_host_collectives"] == 2 and res["metrics"]["compiled_graphs"] >= 2


def _cpu_losses(steps):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import models
    model, make_opt, batch_fn, loss_fn = models.build("gpt", seed=0)
    opt = make_opt(model.parameters())
    losses = []
    for step in range(steps):
        x, y = batch_fn(step)
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("scenario", ["ddp", "fsdp", "tensor_parallel"])
def test_parallel_training_matches_one_process(scenario, tmp_path):
    # DDP and FSDP2 split each batch over the ranks; tensor parallelism splits
    # the MLPs' weights. All must train the shipped GPT to one process's losses.
    steps = 20
    results = spawn(scenario, tmp_path, STEPS=steps)
    want = _cpu_losses(steps)
    for res in results:
        got = res["losses"]
        assert abs(got[0] - want[0]) <= 1e-5 * abs(want[0]), (got, want)
        assert abs(got[-1] - want[-1]) <= 1e-2 * abs(want[-1]), (got, want)
        assert res["metrics"]["distributed_host_collectives"] >= steps  # the collectives went through ours
    assert results[0]["losses"] == results[1]["losses"]
    if scenario == "ddp":  # DDP measured its phases on tpu (a timer for the device type is registered)
        assert all(v > 0 for v in results[0]["ddp_times"].values()), results[0]["ddp_times"]


def _two_ranks(scenario, out, **env):
    port = _port()
    procs = [subprocess.Popen([sys.executable, WORKER, scenario, str(out), "tpu"],
                              env=_env(RANK=r, WORLD_SIZE=WORLD, LOCAL_RANK=r, MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, OUT=out, **env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    assert procs[0].returncode == 0, outs[0][1][-3000:]
    return procs, json.load(open(out / "rank0.json"))


def test_a_dead_rank_makes_the_other_raise_not_hang(tmp_path):
    procs, res = _two_ranks("dead_peer", tmp_path)
    assert procs[1].returncode == 3
    assert res["raised"] is not None and res["raised"][0] == "RuntimeError", res
    assert res["seconds"] < 60, res


def test_a_hung_rank_makes_the_other_raise_within_the_timeout(tmp_path):
    _, res = _two_ranks("hung_peer", tmp_path, DIST_TIMEOUT=5)
    assert res["raised"] is not None and res["raised"][0] == "RuntimeError", res
    assert "timed out" in res["raised"][1].lower() or "timeout" in res["raised"][1].lower(), res
    assert 4 <= res["seconds"] < 30, res
