"""The torch.cuda surface scripts call, on torch.tpu and through
torch.accelerator / torch.Event / torch.Stream: events timing device work,
streams on the device's one queue, allocator statistics, autocast's default dtype."""
import time

import pytest
import torch

import conftest  # noqa: F401  (registers tpu)


def _work(a, n):
    y = a
    for _ in range(n):
        y = (y @ a) * 1e-3
    return y


@pytest.fixture(scope="module")
def operand():
    a = torch.randn(768, 768).to("tpu")
    _work(a, 2).cpu()  # compiled once
    torch.tpu.synchronize()
    return a


def _time_work(a, n):
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    _work(a, n)
    torch.tpu.synchronize()
    return (time.perf_counter() - t0) * 1e3


@pytest.mark.parametrize("make", [
    lambda: torch.tpu.Event(enable_timing=True),
    lambda: torch.Event(device="tpu", enable_timing=True),
], ids=["torch.tpu.Event", "torch.Event"])
def test_event_times_device_work(operand, make):
    n = 40
    work_ms = min(_time_work(operand, n) for _ in range(2))
    start, end = make(), make()
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    start.record()
    y = _work(operand, n)
    end.record()
    end.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    assert end.query() and start.query()
    # complete means the work before it is: nothing of it is still queued
    assert torch.tpu.current_stream().query()
    assert torch.tpu.memory_stats()["queued_executions"] == 0
    elapsed = start.elapsed_time(end)
    assert 0 < elapsed <= host_ms + 5
    assert elapsed >= 0.5 * work_ms, (elapsed, work_ms)
    assert torch.isfinite(y.cpu()).all()


def test_event_timestamp_is_completion_not_record(operand):
    """The end event is timed when the queued work completes: the time the
    host spends after recording (while the device still runs) counts only
    up to that completion, and an event recorded later, once the device is
    idle, is timed at its own recording."""
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    torch.tpu.synchronize()
    start.record()
    _work(operand, 20)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    time.sleep(0.2)
    later = torch.tpu.Event(enable_timing=True)
    later.record()  # nothing in flight: complete at once, timed now
    assert later.query()
    assert start.elapsed_time(later) >= elapsed + 150
    assert end.elapsed_time(later) >= 150


def test_event_query_follows_the_queue(operand):
    e = torch.tpu.Event()
    assert e.query()  # never recorded
    torch.tpu.synchronize()
    _work(operand, 30)
    e.record()
    # while work is queued the event may or may not be complete (the device
    # may already be done); after synchronize it must be
    e.synchronize()
    assert e.query()
    e2 = torch.Event(device="tpu")
    _work(operand, 5)
    e2.record()
    torch.tpu.synchronize()
    assert e2.query()


def test_event_checks():
    a, b = torch.tpu.Event(), torch.tpu.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing"):
        a.elapsed_time(b)
    c, d = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    c.record()
    with pytest.raises(ValueError, match="recorded"):
        c.elapsed_time(d)
    e = torch.tpu.Event(enable_timing=True)
    e.record(torch.tpu.current_stream(1))
    assert e.device == torch.device("tpu", 1)
    e.synchronize()
    e.wait()
    assert e.query()


def test_streams_are_distinct_on_one_queue():
    s = torch.tpu.current_stream()
    assert isinstance(s, torch.Stream)
    assert s == torch.tpu.default_stream() == torch.accelerator.current_stream()
    assert s.device == torch.device("tpu", 0) and s.stream_id == 0
    assert torch.tpu.current_stream(1).device == torch.device("tpu", 1)
    new = torch.tpu.Stream()
    assert new != s and new != torch.Stream(device="tpu")  # a new stream each time, as CUDA's
    torch.accelerator.set_stream(s)
    with torch.tpu.stream(new) as entered:
        assert entered is new
        assert torch.tpu.current_stream() == new == torch.accelerator.current_stream()
        x = torch.ones(4, device="tpu") * 2
    assert torch.tpu.current_stream() == s
    with torch.tpu.stream(None):
        pass
    with torch.tpu.stream(torch.tpu.Stream(1)):
        assert torch.tpu.current_device() == 1
    assert torch.tpu.current_device() == 0
    with pytest.raises(ValueError):
        torch.tpu.set_stream(torch.Stream(device="cpu"))
    ev = new.record_event()
    assert isinstance(ev, torch.tpu.Event)
    new.wait_event(ev)
    new.wait_event(torch.Event(device="tpu"))
    new.wait_stream(torch.tpu.current_stream())
    s.wait_stream(new)  # torch.Stream's own methods
    s.wait_event(s.record_event())
    new.synchronize()
    assert new.query() and s.query()
    assert x.cpu().tolist() == [2.0] * 4
    torch.tpu.set_stream(new)  # makes it current until set back
    assert torch.tpu.current_stream() == new
    torch.tpu.set_stream(s)


def test_generic_stream_context_switches_device_and_stream():
    # PyTorch's `with torch.Stream(...)` switches only when the stream is not
    # the current one: with every stream the default one, tensors made inside
    # silently stayed on tpu:0.
    for make in (lambda: torch.Stream(device="tpu:1"), lambda: torch.tpu.Stream(1)):
        s = make()
        with s:
            assert torch.accelerator.current_device_index() == 1
            assert torch.accelerator.current_stream(1) == s
            y = torch.ones(2, device="tpu") + 1
        assert y.device == torch.device("tpu", 1)
        assert torch.accelerator.current_device_index() == 0
        assert torch.accelerator.current_stream(1).stream_id == 0
        assert y.cpu().tolist() == [2.0, 2.0]


def test_bad_device_indices_raise():
    n = torch.tpu.device_count()
    for call in (lambda: torch.Stream(device=f"tpu:{n}"), lambda: torch.Generator(device=f"tpu:{n}"),
                 lambda: torch.accelerator.synchronize(n)):
        with pytest.raises(RuntimeError, match="invalid device index"):
            call()
    assert torch.Generator(device=f"tpu:{n - 1}").device == torch.device("tpu", n - 1)


def test_device_capability_lists_the_dtypes_tpu_tensors_take():
    if not hasattr(torch.accelerator, "get_device_capability"):
        pytest.skip("torch.accelerator.get_device_capability is new in this torch")
    dtypes = torch.accelerator.get_device_capability("tpu:0")["supported_dtypes"]
    for dt in dtypes:
        assert torch.zeros(2, dtype=dt).to("tpu").dtype == dt
    assert {torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.uint64, torch.float8_e4m3fn,
            torch.float8_e5m2} <= dtypes
    for dt in (torch.complex32, torch.float8_e8m0fnu, torch.qint8):
        assert dt not in dtypes


def test_rng_state_of_all_devices():
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count()
    a = [torch.rand(3, device=f"tpu:{i}").cpu() for i in range(len(states))]
    torch.tpu.set_rng_state_all(states)
    b = [torch.rand(3, device=f"tpu:{i}").cpu() for i in range(len(states))]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.tpu.seed_all()
    seeds = {torch.tpu.default_generator(i).initial_seed() for i in range(len(states))}
    assert len(seeds) == 1


def test_host_allocator_and_pinned_slices():
    torch.ones(1, device="tpu")
    torch.accelerator.empty_host_cache()  # crashed (no host allocator for the device)
    p = torch.arange(10.0).pin_memory()
    assert p.is_pinned() and p.untyped_storage()[8:].is_pinned() and p[3:].is_pinned()
    assert not torch.arange(10.0).is_pinned()
    assert torch.equal(p[3:].to("tpu", non_blocking=True).cpu(), torch.arange(3.0, 10.0))


def test_legacy_autograd_profiler_times_tpu_ops():
    from torch.autograd.profiler import profile
    x = torch.randn(32, 32, device="tpu")
    (x @ x).cpu()
    with profile(use_device="tpu") as prof:
        (x @ x + x).cpu()
    names = {e.name for e in prof.function_events}
    assert {"aten::mm", "aten::add"} <= names, names
    for e in prof.function_events:
        assert 0 <= e.cpu_time_total < 60e6 and 0 <= e.device_time_total < 60e6, (e.name, e.cpu_time_total)


def test_synchronize_surface():
    torch.ones(3, device="tpu").add_(1)
    torch.tpu.synchronize()
    torch.tpu.synchronize(1)
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    assert torch.tpu.current_stream().query()


def test_accelerator_is_tpu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == torch.tpu.current_device()


def _settled():
    torch.tpu.synchronize()
    torch.tpu.empty_cache()


def test_accelerator_memory_matches_torch_tpu():
    _settled()
    base = torch.accelerator.memory_allocated()
    assert base == torch.tpu.memory_allocated() == torch.accelerator.memory_allocated(0)
    x = torch.ones(256, 1024, device="tpu")  # written: 1 MiB on the device
    _settled()
    grown = torch.accelerator.memory_allocated()
    assert grown == torch.tpu.memory_allocated()
    assert grown - base >= x.numel() * 4
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated() >= grown
    assert torch.accelerator.memory_reserved() == torch.tpu.memory_reserved() >= grown
    assert torch.accelerator.max_memory_reserved() == torch.tpu.max_memory_reserved()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == grown
    assert stats["allocation.all.current"] >= 1
    tpu_stats = torch.tpu.memory_stats()
    for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current"):
        assert tpu_stats[k] == stats[k]
    assert tpu_stats["allocated_bytes"] == grown
    del x
    _settled()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() == base
    assert torch.accelerator.max_memory_allocated() >= grown
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated() == base
    freed_before = torch.accelerator.memory_stats()["allocated_bytes.all.freed"]
    assert freed_before >= 256 * 1024 * 4
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.freed"] == 0
    torch.tpu.reset_accumulated_memory_stats()
    torch.accelerator.empty_cache()
    if hasattr(torch.accelerator, "get_memory_info"):
        free, total = torch.accelerator.get_memory_info()
        assert total == torch.tpu.mem_get_info()[1] and 0 <= free <= total


def test_memory_on_the_second_device():
    _settled()
    base = torch.accelerator.memory_allocated(1)
    y = torch.ones(1024, device="tpu:1")
    _settled()
    assert torch.accelerator.memory_allocated(1) == torch.tpu.memory_allocated(1) >= base + 4096
    del y


def test_cuda_memory_calls_exist():
    _settled()
    torch.tpu.empty_cache()
    torch.tpu.reset_max_memory_allocated()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved() >= 0
    free, total = torch.tpu.mem_get_info()
    assert 0 <= free <= total
    text = torch.tpu.memory_summary()
    assert "allocated" in text and "tpu:0" in text
    assert torch.tpu.memory_summary(abbreviated=True)
    assert torch.tpu.get_per_process_memory_fraction() == 1.0
    props = torch.tpu.get_device_properties(0)
    assert props.name and props.total_memory > 0 and props.type == "tpu"
    assert torch.tpu.get_device_properties(torch.device("tpu:1")).total_memory > 0


def test_bf16_supported():
    assert torch.tpu.is_bf16_supported() is True
    assert torch.tpu.is_bf16_supported(including_emulation=False) is True


def test_autocast_default_dtype_is_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    lin = torch.nn.Linear(8, 4).to("tpu")
    with torch.autocast("tpu"):
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
        y = lin(torch.randn(2, 8, device="tpu"))
    assert y.dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        assert lin(torch.randn(2, 8, device="tpu")).dtype == torch.float16
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16


def test_device_of_and_out_of_memory_error_as_torch_cuda():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs a second tpu device")
    before = torch.tpu.current_device()
    with torch.tpu.device_of(torch.ones(2, device="tpu:1")):
        assert torch.tpu.current_device() == 1
    with torch.tpu.device_of(torch.ones(2)):          # a CPU tensor: unchanged
        assert torch.tpu.current_device() == before
    assert torch.tpu.current_device() == before
    with pytest.raises(torch.tpu.OutOfMemoryError):   # code written for CUDA catches it by this name
        torch.empty(2**50, device="tpu")


def test_seeding_does_not_import_dynamo():
    """torch.manual_seed seeds tpu through functions kept out of Dynamo's tracing;
    that must not import Dynamo (1.2 s, paid by every DataLoader worker, which seeds)."""
    import subprocess
    import sys
    code = ("import sys, torch, torch_pjrt; torch.manual_seed(0); torch.tpu.manual_seed_all(1); "
            "torch.tpu.seed(); torch.tpu.initial_seed(); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
