"""On-device collectives (csrc/distributed/collective_programs.cpp,
device_backend.cpp, runtime/multi_device.cpp, runtime/kv_store.cpp): each
collective as an XLA program compiled replicated over several devices.

The CPU plugin has no collectives across processes, but it runs these
programs across its own devices inside one process. So the programs, the
replicated compile and launch, and the c10d backend (two ranks as two
threads, each launching its own part as processes do) are checked here
against the same collectives computed on CPU. The distributed client (PJRT's
kv callbacks over the c10d store) is checked as far as the CPU plugin allows:
the client is made again with the options, and the callbacks are called as
a plugin calls them."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = torch_pjrt._state.C
# Programs over 2 devices need 2 devices of one client (the CPU plugin's
# default; a machine with one GPU skips them).
two_devices = pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs 2 devices in this process")
REDUCTIONS = {"sum": lambda a, b: a + b, "product": lambda a, b: a * b, "min": torch.minimum,
              "max": torch.maximum}


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CPU_DEVICES="2")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(code, **env):
    proc = subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True, text=True,
                          timeout=180)
    return proc


def _pair(dtype, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.rand(n, generator=g) > 0.5 for _ in range(2)]
    if dtype.is_floating_point:
        return [(torch.randn(n, generator=g) * 3).to(dtype) for _ in range(2)]
    if dtype.is_complex:
        return [torch.randn(n, generator=g, dtype=dtype) for _ in range(2)]
    return [torch.randint(-50, 50, (n,), generator=g).to(dtype) for _ in range(2)]


def _local(kind, inputs, reduction="sum", root=0):
    return [o.cpu() for o in C.run_collective_locally(kind, [x.to(f"tpu:{i}") for i, x in enumerate(inputs)],
                                                       reduction, root)]


def _reduce(reduction, a, b):
    if a.dtype == torch.bool:
        return (a | b) if reduction in ("sum", "max") else (a & b)
    if reduction == "avg":
        return (a + b) / 2 if a.dtype.is_floating_point or a.dtype.is_complex else torch.div(a + b, 2,
                                                                                              rounding_mode="trunc")
    return REDUCTIONS[reduction](a, b)


@two_devices
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool])
@pytest.mark.parametrize("reduction", ["sum", "avg", "product", "min", "max"])
def test_all_reduce_and_reduce_scatter_programs_match_cpu(dtype, reduction):
    if dtype == torch.bool and reduction == "avg":
        with pytest.raises(TypeError, match="AVG"):
            _local("all_reduce", _pair(dtype), reduction)
        return
    a, b = _pair(dtype)
    want = _reduce(reduction, a, b)
    for out in _local("all_reduce", [a, b], reduction):
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    # reduce_scatter: rank r keeps part r of the reduced vector
    parts = _local("reduce_scatter", [a, b], reduction)
    torch.testing.assert_close(torch.cat(parts), want, rtol=0, atol=0)


@two_devices
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_gather_broadcast_all_to_all_permute_programs_match_cpu(dtype):
    a, b = _pair(dtype, seed=1)
    for out in _local("all_gather", [a, b]):
        assert torch.equal(out, torch.cat([a, b]))
    for root in (0, 1):
        for out in _local("broadcast", [a, b], root=root):
            assert torch.equal(out, [a, b][root])
    o0, o1 = _local("all_to_all", [a, b])
    assert torch.equal(o0, torch.cat([a[:6], b[:6]])) and torch.equal(o1, torch.cat([a[6:], b[6:]]))
    _, received = _local("permute", [a, b])
    assert torch.equal(received, a)
    if dtype == torch.complex64:
        out = _local("all_reduce", [a, b], "sum")[0]
        torch.testing.assert_close(out, a + b, rtol=0, atol=0)


@two_devices
def test_broadcast_keeps_exact_bits():
    """-0.0, NaN and inf travel unchanged (a masked sum would lose -0.0)."""
    a = torch.tensor([-0.0, float("nan"), float("inf"), 1e-45])
    b = torch.zeros(4)
    for out in _local("broadcast", [a, b], root=0):
        assert torch.equal(out.view(torch.int32), a.view(torch.int32))


@two_devices
def test_collective_program_errors_name_the_problem():
    a = torch.ones(5)
    with pytest.raises(ValueError, match="reduce_scatter of 5 elements does not split evenly over 2 ranks"):
        _local("reduce_scatter", [a, a])
    c = torch.ones(4, dtype=torch.complex64)
    with pytest.raises(TypeError, match="complex"):
        _local("all_reduce", [c, c], "max")
    with pytest.raises(ValueError, match="device of its own"):
        C.run_collective_locally("all_reduce", [a.to("tpu:0"), a.to("tpu:0")], "sum", 0)


def test_replicated_program_is_one_stablehlo_collective():
    text = C.collective_program("all_reduce", 8, 2)
    assert '"stablehlo.all_reduce"' in text and "mhlo.num_replicas = 2" in text
    assert "dense<[[0, 1]]>" in text
    assert '"stablehlo.all_gather"' in C.collective_program("all_gather", 8, 4)


@two_devices
def test_device_backend_two_ranks_as_threads():
    """Every collective of the c10d backend, two ranks launching their own
    parts (fixtures/device_backend_threads.py), against CPU."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fixtures", "device_backend_threads.py")],
                          env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == []
    r0, r1 = res["ranks"]
    base = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(2)]
    s = base[0] + base[1]
    for r in (r0, r1):
        assert r["all_reduce_SUM"] == s.tolist()
        assert r["all_reduce_AVG"] == (s / 2).tolist()
        assert r["all_reduce_PRODUCT"] == (base[0] * base[1]).tolist()
        assert r["all_reduce_MIN"] == base[0].tolist() and r["all_reduce_MAX"] == base[1].tolist()
        assert r["all_reduce_int64"] == s.long().tolist()
        assert r["all_reduce_bfloat16"] == ((base[0] / 3).bfloat16() + (base[1] / 3).bfloat16()).float().tolist()
        assert r["all_reduce_bool_max"] == ((base[0] % 2 == 0) | (base[1] % 2 == 1)).tolist()
        assert r["broadcast"] == base[1].tolist()
        assert r["all_gather"] == [base[0].reshape(2, 3).tolist(), base[1].reshape(2, 3).tolist()]
        assert r["all_gather_into_tensor"] == torch.cat(base).tolist()
    for rank, r in enumerate((r0, r1)):
        m = [torch.arange(12, dtype=torch.float32).reshape(3, 4) + k for k in range(2)]
        want = m[rank].clone()
        want[:, 1] = m[0][:, 1] + m[1][:, 1]
        assert r["all_reduce_view"] == want.tolist()  # a strided view, written in place, the rest untouched
        assert r["reduce_scatter_tensor"] == s[3 * rank:3 * rank + 3].tolist()
        assert r["reduce_scatter"] == s[3 * rank:3 * rank + 3].tolist()
        assert r["all_to_all_single"] == torch.cat([b[3 * rank:3 * rank + 3] for b in base]).tolist()
        assert r["all_to_all"] == [b[3 * rank:3 * rank + 3].tolist() for b in base]
    assert r0["reduce"] == s.tolist() and r1["reduce"] == base[1].tolist()  # only the root keeps it
    assert r0["all_to_all_uneven"] == [0.0, 10.0, 11.0]
    assert r1["all_to_all_uneven"] == [1.0, 2.0, 3.0, 4.0, 5.0, 12.0, 13.0, 14.0, 15.0]
    assert r1["recv"] == base[0].tolist()
    # 19 collectives per rank ran as programs; the uneven all_to_all took the host path
    assert res["device_collectives"] == 38 and res["host_collectives"] == 2


@two_devices
def test_ddp_two_ranks_as_threads_matches_one_process():
    """DDP over the device backend (buckets, hooks, futures), 2 ranks as
    threads each on half of every batch: the mean of their losses and the
    parameters after 5 SGD steps equal one process on the whole batch."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fixtures", "device_backend_threads.py"), "ddp"],
                          env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == []
    r0, r1 = res["ranks"]
    ref = res["reference"]
    mean = [(a + b) / 2 for a, b in zip(r0["losses"], r1["losses"])]
    torch.testing.assert_close(torch.tensor(mean), torch.tensor(ref["losses"]), rtol=1e-5, atol=1e-6)
    for p0, p1, pr in zip(r0["params"], r1["params"], ref["params"]):
        assert p0 == p1  # the ranks agree exactly
        torch.testing.assert_close(torch.tensor(p0), torch.tensor(pr), rtol=1e-5, atol=1e-6)
    assert res["device_collectives"] >= 2 * 5 and res["host_collectives"] == 0


@two_devices
def test_a_peer_that_never_joins_ends_the_process_after_the_timeout():
    """Rank 1 never launches its part of rank 0's all_reduce: the watchdog
    ends the process after the group's timeout (3 s) with a message naming
    the collective, rank and device, instead of a wait without end."""
    import time
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fixtures", "device_backend_threads.py"),
                           "hang"], env=_env(), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert ("all_reduce on rank 0 (tpu:0, 4 elements) did not complete within the process group's timeout "
            "(3000 ms)") in proc.stderr, proc.stderr[-2000:]
    assert "finished" not in proc.stdout
    assert elapsed < 30, elapsed  # the plugin's own rendezvous would abort only after 40 s


def test_one_rank_process_group_runs_on_device():
    """TORCH_PJRT_DEVICE_COLLECTIVES=1 with one rank: init_process_group,
    the collectives and DDP go through the device backend."""
    code = r"""
import torch, torch_pjrt, torch.distributed as dist
dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
t = torch.arange(4., device="tpu")
dist.all_reduce(t, op=dist.ReduceOp.AVG)
out = torch.empty(8, device="tpu")
dist.all_gather_into_tensor(out[:4], t)
dist.broadcast(t, 0)
dist.barrier()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
ref = torch.nn.Linear(4, 2); ref.load_state_dict(model.state_dict())
ddp = torch.nn.parallel.DistributedDataParallel(model.to("tpu"))
x = torch.randn(8, 4)
ddp(x.to("tpu")).sum().backward(); ref(x).sum().backward()
torch.testing.assert_close(model.weight.grad.cpu(), ref.weight.grad, rtol=1e-5, atol=1e-6)
m = torch_pjrt.metrics()
assert t.cpu().tolist() == [0., 1., 2., 3.], t
assert m["distributed_device_collectives"] >= 4 and m["distributed_host_collectives"] == 0, m
print("ok")
"""
    proc = _run(code, TORCH_PJRT_DEVICE_COLLECTIVES="1")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_compiled_graph_lowers_functional_collectives_into_its_program():
    """With the device path, a compiled graph's functional collectives
    (all_reduce avg, all_gather, reduce_scatter, broadcast) become
    stablehlo collectives inside the graph's one program (replicated over the
    group's devices: one here): one execution, no pieces, no warning, the
    values of the same function on CPU. On the host path the same graph is
    compiled in pieces around them (tests/test_distributed.py)."""
    code = r"""
import warnings
import torch, torch_pjrt, torch.distributed as dist
import torch.distributed._functional_collectives as fc
warnings.simplefilter("error")
dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
def f(x, w):
    a = fc.all_reduce(x @ w, "avg", dist.group.WORLD)
    g = fc.all_gather_tensor(a, 0, dist.group.WORLD)
    r = fc.reduce_scatter_tensor(g * 2, "sum", 0, dist.group.WORLD)
    b = fc.broadcast(r, 0, dist.group.WORLD)
    return b.relu().sum(0)
torch.manual_seed(0)
x, w = torch.randn(4, 3), torch.randn(3, 5)
cf = torch.compile(f, backend="tpu")
cf(x.to("tpu"), w.to("tpu"))
before = torch_pjrt.metrics()
out = cf(x.to("tpu"), w.to("tpu")).cpu()
after = torch_pjrt.metrics()
torch.testing.assert_close(out, ((x @ w) * 2).relu().sum(0), rtol=1e-5, atol=1e-5)
assert after["executions"] - before["executions"] == 1, (before["executions"], after["executions"])
assert after["distributed_device_collectives"] == 0 and after["distributed_host_collectives"] == 0, after
print("ok")
"""
    proc = _run(code, TORCH_PJRT_DEVICE_COLLECTIVES="1", TORCH_PJRT_DUMP="1")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    assert "mhlo.num_replicas = 1" in proc.stderr
    for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter"):
        assert op in proc.stderr, op


def test_a_collective_inside_a_captured_step_falls_back_and_stays_right():
    """capture_step cannot replay a step whose collective runs outside its
    program: it says so (flush reason 'collective') and runs the step under
    fused eager, with the right values."""
    code = r"""
import warnings
import torch, torch_pjrt, torch.distributed as dist
dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
w = torch.ones(4, device="tpu")
@torch_pjrt.capture_step
def step(x):
    y = x * 2
    dist.all_reduce(y)
    w.add_(y)
    return y.sum()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for i in range(6):
        step(torch.full((4,), float(i), device="tpu"))
msgs = [str(m.message) for m in seen if "capture_step" in str(m.message)]
assert len(msgs) == 1 and "flush reason 'collective'" in msgs[0], msgs
m = torch_pjrt.metrics()
assert m["capture_replays"] == 0 and m["distributed_device_collectives"] == 6, m
assert w.cpu().tolist() == [31.0] * 4, w
print("ok")
"""
    proc = _run(code, TORCH_PJRT_DEVICE_COLLECTIVES="1")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_bad_mode_is_a_value_error():
    code = r"""
import torch, torch_pjrt, torch.distributed as dist
try:
    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
except ValueError as e:
    print("ValueError:", e)
"""
    proc = _run(code, TORCH_PJRT_DEVICE_COLLECTIVES="yes")
    assert "TORCH_PJRT_DEVICE_COLLECTIVES must be one of auto, 0, 1, got 'yes'" in proc.stdout, proc.stderr[-2000:]


def test_distributed_client_is_made_again_before_any_tensor():
    """make_distributed_client: the client is created again as node 0 of 2
    with the kv callbacks (the CPU plugin takes and ignores them) and the
    device works after; once a tensor exists it refuses, saying why."""
    code = r"""
import torch, torch_pjrt, torch.distributed as dist
C = torch_pjrt._state.C
C.make_distributed_client(dist.HashStore(), 0, 2)
assert C.client_node() == (0, 2)
x = torch.arange(6., device="tpu:1") * 2
assert x.cpu().tolist() == [0., 2., 4., 6., 8., 10.]
assert torch.tpu.device_count() == 2
print("ok")
"""
    proc = _run(code)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    code = r"""
import torch, torch_pjrt, torch.distributed as dist
C = torch_pjrt._state.C
x = torch.ones(3, device="tpu")
try:
    C.make_distributed_client(dist.HashStore(), 0, 2)
except RuntimeError as e:
    print("RuntimeError:", e)
assert C.client_node() == (0, 1)
assert (x + 1).cpu().tolist() == [2., 2., 2.]
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cannot make plugin 'cpu''s client span processes" in proc.stdout
    assert "call init_process_group before using tpu tensors" in proc.stdout


def test_two_processes_on_the_cpu_plugin_fall_back_to_host_copies(tmp_path):
    """TORCH_PJRT_DEVICE_COLLECTIVES=1 under 2 spawned processes: each client
    is made again as a node of 2, the CPU plugin's still covers only its own
    process, so the group warns once per rank and takes the host path, with
    the right results."""
    script = tmp_path / "two.py"
    script.write_text(r"""
import os, sys, socket, warnings
import torch, torch.distributed as dist, torch.multiprocessing as mp
def work(rank, port):
    import torch_pjrt
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.init_process_group("tpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    assert any("offers no collectives across processes" in str(w.message) for w in seen), [str(w.message) for w in seen]
    assert torch_pjrt._state.C.client_node() == (rank, 2)
    t = torch.full((3,), float(rank + 1), device="tpu")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [3., 3., 3.], t
    m = torch_pjrt.metrics()
    assert m["distributed_host_collectives"] == 1 and m["distributed_device_collectives"] == 0, m
    dist.destroy_process_group()
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(work, args=(port,), nprocs=2)
    print("ok")
""")
    proc = subprocess.run([sys.executable, str(script)], env=_env(TORCH_PJRT_DEVICE_COLLECTIVES="1"),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("store_kind", ["hash", "tcp"])
def test_kv_callbacks_over_the_c10d_store(store_kind):
    """PJRT's key-value callbacks, called as a plugin calls them: values
    round-trip (binary too), a missing key times out (DEADLINE_EXCEEDED) or
    is not found (NOT_FOUND), within the timeout given."""
    import time
    from datetime import timedelta
    if store_kind == "hash":
        store = dist.HashStore()
    else:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
    value = bytes(range(256)) * 3
    assert C.kv_callback(store, "put", "gpu:topology/0", value, 0) == b""
    assert C.kv_callback(store, "get", "gpu:topology/0", b"", 1000) == value
    assert C.kv_callback(store, "try_get", "gpu:topology/0", b"", 0) == value
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"code 4: .*'missing' did not appear in the store within 200 ms"):
        C.kv_callback(store, "get", "missing", b"", 200)
    assert time.monotonic() - t0 < 5
    with pytest.raises(RuntimeError, match=r"code 5: .*'missing' not set"):
        C.kv_callback(store, "try_get", "missing", b"", 0)
