"""Device memory: what memory_allocated() counts (every live buffer, also
those only queued work holds), out of memory as torch.OutOfMemoryError at the
op that asked (then the process keeps working), TORCH_PJRT_MEMORY_LIMIT /
set_memory_limit, the bounded asynchronous queue, and the figures CUDA
scripts read (mem_get_info, get_device_properties().total_memory)."""
import pytest
import torch

import torch_pjrt
from conftest import run_json, run_python, tpu

MiB = 1 << 20


@pytest.fixture
def limit():
    """Sets a memory limit on tpu:0 for one test, then removes it."""
    old = torch_pjrt.memory_limit(0)

    def set_(nbytes):
        torch_pjrt.set_memory_limit(nbytes, device=0)
    yield set_
    torch_pjrt.set_memory_limit(old, device=0)


def settled():
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def test_counts_from_first_write_and_frees():
    before = settled()
    t = torch.empty(MiB // 4, device="tpu")  # 1 MiB, not written yet: nothing on the device
    assert settled() == before
    t.fill_(2.0)
    assert settled() == before + MiB
    u = t * 3  # a program output
    assert settled() == before + 2 * MiB
    del t, u
    assert settled() == before


@pytest.mark.strict_eager  # (fused eager never runs a trace whose results all died)
def test_queued_work_holds_and_counts_its_buffers():
    # Results whose tensors die at once still occupy the device until their
    # executions finish: they are counted (held_by_queue_bytes) until then.
    x = torch.randn(1024, 1024).to("tpu")
    (x @ x).cpu()  # compiled and warm
    before = settled()
    for _ in range(8):  # ~tens of ms each on the CPU plugin: launched far ahead
        y = x @ x
        del y
    stats = torch.tpu.memory_stats()
    assert stats["queued_executions"] > 0
    assert stats["held_by_queue_bytes"] >= x.nbytes
    assert stats["allocated_bytes"] >= before + stats["held_by_queue_bytes"]
    assert torch.tpu.max_memory_allocated() >= before + x.nbytes
    assert settled() == before  # finished work let go of everything
    assert torch.tpu.memory_stats()["queued_executions"] == 0


def test_out_of_memory_raises_at_the_op_and_process_keeps_working(limit):
    before = settled()
    limit(before + 8 * MiB)
    keep = [torch.ones(MiB // 4).to("tpu") for _ in range(6)]  # 6 MiB
    x = keep[0]
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.cat([x] * 12)  # 12 MiB more
    msg = str(e.value)
    # `before`: what earlier tests of this process still hold (counted in use and under the limit)
    assert "tried to allocate 12.00 MiB" in msg, msg
    assert f"{(before + 6 * MiB) / MiB:.2f} MiB already in use" in msg, msg
    assert f"limit {(before + 8 * MiB) / MiB:.2f} MiB" in msg, msg
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate 8.00 MiB"):
        x.reshape(-1, 1) * tpu(torch.ones(1, 8))  # a broadcast result
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate 16.00 MiB"):
        torch.ones(4 * MiB).to("tpu")
    with pytest.raises(torch.OutOfMemoryError, match="a new tensor tried to allocate 64.00 MiB"):
        torch.empty(16 * MiB, device="tpu")
    # Still working, and freeing makes room again.
    assert (x + 1).sum().item() == 2.0 * (MiB // 4)
    del keep  # (x keeps 1 MiB)
    y = torch.cat([x] * 6)
    assert y.shape[0] == 6 * (MiB // 4)
    assert torch_pjrt.metrics()["out_of_memory_errors"] >= 3


def test_oom_is_caught_by_users_handlers(limit):
    w = torch.randn(256, 4096).to("tpu")  # 4 MiB
    limit(settled() + 6 * MiB)
    x = torch.randn(64 * 16, 256)
    batch, fitted = 64, None
    while batch >= 1:  # the usual "halve the batch on OOM" loop
        try:
            y = x[:batch * 16].to("tpu") @ w  # batch x 256 KiB
            fitted = batch
            break
        except torch.OutOfMemoryError:
            batch //= 2
    assert fitted == 16
    assert torch.allclose(y.cpu(), x[:256] @ w.cpu(), rtol=1e-4, atol=1e-4)


def test_empty_larger_than_the_device_raises():
    total = torch.tpu.get_device_properties(0).total_memory
    assert total > 0
    with pytest.raises(torch.OutOfMemoryError, match="tried to allocate"):
        torch.empty(total // 4 + 1024, device="tpu")  # float32: just over the device
    assert torch.zeros(4, device="tpu").sum().item() == 0


def test_limit_from_environment_and_fraction():
    out = run_json(r"""
import json, torch, torch_pjrt
r = {"limit": torch_pjrt.memory_limit(0), "info": list(torch.tpu.mem_get_info(0)),
     "total": torch.tpu.get_device_properties(0).total_memory}
try:
    torch.empty(40 << 20, device="tpu")
    r["oom"] = False
except torch.OutOfMemoryError as e:
    r["oom"] = True
torch.tpu.set_per_process_memory_fraction(0.5, 0)
r["half"] = torch_pjrt.memory_limit(0)
r["fraction"] = torch.tpu.get_per_process_memory_fraction(0)
print("RESULT " + json.dumps(r))
""", TORCH_PJRT_MEMORY_LIMIT="32MiB")
    assert out["limit"] == 32 * MiB
    assert out["info"][1] == 32 * MiB and 0 <= out["info"][0] <= 32 * MiB
    assert out["oom"]
    assert out["half"] == out["total"] // 2
    assert abs(out["fraction"] - 0.5) < 1e-6


def test_bad_limit_setting_is_a_clear_error():
    p = run_python("import torch_pjrt", TORCH_PJRT_MEMORY_LIMIT="lots")
    assert p.returncode != 0 and "TORCH_PJRT_MEMORY_LIMIT" in p.stderr and "lots" in p.stderr


def test_queue_is_bounded_and_memory_stays_near_the_limit():
    # The case: a producer far ahead of the device, each op making a
    # large result that dies at once. The queue bound and the limit make it
    # wait instead of growing without bound.
    out = run_json(r"""
import json, torch, torch_pjrt
# This process's own peak (VmHWM): getrusage's ru_maxrss starts from the peak
# of the process that forked it (pytest's, which can exceed 2 GiB by then).
def peak_rss_mib():
    return int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) / 1024
x = torch.ones(16 << 20).to("tpu")  # 64 MiB
torch.tpu.synchronize()
peak_queue = 0
for i in range(40):
    y = x * float(i)
    del y
    peak_queue = max(peak_queue, torch.tpu.memory_stats()["queued_executions"])
torch.tpu.synchronize()
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"peak_queue": peak_queue, "waits": m["queue_full_waits"],
      "drains": m["memory_drains"], "max_alloc": torch.tpu.max_memory_allocated(),
      "rss_mib": peak_rss_mib()}))
""", TORCH_PJRT_MAX_INFLIGHT="4", TORCH_PJRT_MEMORY_LIMIT="512MiB")
    assert out["peak_queue"] <= 4
    assert out["max_alloc"] <= 512 * MiB
    assert out["rss_mib"] < 2048, out  # 40 x 64 MiB would be 2.5 GiB


def test_device_figures_cuda_scripts_read():
    free, total = torch.tpu.mem_get_info()
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory == total > 0 and 0 <= free <= total
    assert props.type == "tpu" and props.platform == torch.tpu.get_device_name()
    assert torch.tpu.memory_reserved() >= 0
    s = torch.tpu.memory_stats()
    for k in ("allocated_bytes", "peak_allocated_bytes", "held_by_queue_bytes", "limit_bytes", "total_bytes"):
        assert k in s


@pytest.mark.parametrize("make", [
    lambda n: torch.ones(n, device="tpu"),
    lambda n: torch.full((n,), 0.5, device="tpu"),
    lambda n: torch.empty(n, device="tpu").uniform_(),
    lambda n: torch.nn.init.kaiming_uniform_(torch.empty(n // 64, 64, device="tpu")),
], ids=["ones", "full", "uniform_", "kaiming_uniform_"])
def test_a_new_tensor_is_made_in_one_buffer(make):
    # A storage never written enters the program as zeros made inside it, so
    # filling a new tensor holds one buffer of its size (it was two: a zero
    # buffer sent from the host, then the result).
    n = 1 << 16
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    stats0 = torch.tpu.memory_stats()
    t = make(n)
    torch.tpu.synchronize()
    stats1 = torch.tpu.memory_stats()
    assert torch.tpu.max_memory_allocated() - base <= n * 4 + 64  # (+ a random op's 16-byte key)
    assert stats1["allocated_bytes.all.freed"] - stats0["allocated_bytes.all.freed"] <= 64
    assert t.isfinite().all().item()


def test_never_written_storage_reads_and_partial_writes_as_zeros():
    # Unwritten memory reads as zeros on tpu (CPU's is garbage); a partial
    # write (a view, an out=) keeps zeros around it, with or without a cached
    # program for the written case.
    for _ in range(2):
        e = torch.empty(10, device="tpu")
        e[2:5].fill_(7.0)
        assert e.cpu().tolist() == [0.0] * 2 + [7.0] * 3 + [0.0] * 5
        out = torch.empty(4, 3, device="tpu")
        torch.add(tpu(torch.ones(3)), 1, out=out[1])
        assert out.cpu().tolist() == [[0.0] * 3, [2.0] * 3, [0.0] * 3, [0.0] * 3]
        assert (torch.empty(5, device="tpu") + 1).cpu().tolist() == [1.0] * 5
        w = torch.empty(6, dtype=torch.int16, device="tpu").view(torch.int32)[1:]  # reinterpreted
        w.fill_(3)
        assert w.cpu().tolist() == [3, 3]
