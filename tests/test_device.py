"""The tpu device: torch.tpu API, transfers, several devices, serialization, metrics."""
import io
import os

import pytest
import torch

import torch_pjrt
from conftest import ALL_DTYPES, assert_same, make, tpu, run_python

ON_CPU_PLUGIN = torch_pjrt.plugin_info()["name"] == "cpu"
cpu_plugin_only = pytest.mark.skipif(not ON_CPU_PLUGIN, reason="checks the CPU plugin's options")


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two devices")
def test_device_module():
    assert torch.tpu.is_available()
    if ON_CPU_PLUGIN:
        assert torch.tpu.device_count() >= 2  # TORCH_PJRT_CPU_DEVICES defaults to 2
    assert torch.tpu.get_device_name() == torch_pjrt.plugin_info()["platform"]
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(1)
    try:
        assert torch.tpu.current_device() == 1
        assert torch.empty(2, device="tpu").device == torch.device("tpu", 1)
    finally:
        torch.tpu.set_device(0)
    torch.tpu.synchronize()


def test_plugin_info():
    info = torch_pjrt.plugin_info()
    assert info["name"] in ("cpu", "cuda", "tpu") and info["path"].endswith(".so")
    assert info["api_version"][0] == 0 and info["api_version"][1] >= 40


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_roundtrip_every_dtype(dtype):
    x = make((3, 5), dtype=dtype)
    t = x.to("tpu")
    assert t.device.type == "tpu" and t.dtype == dtype
    assert torch.equal(t.cpu(), x)


@pytest.mark.parametrize("src", ALL_DTYPES)
@pytest.mark.parametrize("dst", ALL_DTYPES)
def test_casts_on_device(src, dst):
    # Values every dtype holds exactly (out-of-range float->int casts are undefined in C).
    low = 0 if torch.uint8 in (src, dst) else -100
    x = make((4, 3), dtype=src, low=low, high=100)
    if src.is_floating_point:
        x = x.round() + 0.25 if dst != torch.bool else x  # fractional part: truncation toward zero
    assert_same(tpu(x).to(dst), x.to(dst))
    assert_same(tpu(x).t().to(dst), x.t().to(dst))  # non-contiguous source


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two devices")
def test_copy_between_devices_and_host():
    x = make((4, 4))
    a = x.to("tpu:0")
    b = a.to("tpu:1")
    assert b.device == torch.device("tpu", 1)
    assert torch.equal(b.cpu(), x)
    c = torch.zeros(4, 4, device="tpu:1")
    c.copy_(a.t())
    assert torch.equal(c.cpu(), x.t())
    d = torch.empty(4, 4)
    d.copy_(b)
    assert torch.equal(d, x)
    with pytest.raises(RuntimeError, match="same device"):
        a + b


def test_mixing_cpu_and_tpu_tensors_errors_like_cuda():
    with pytest.raises(RuntimeError, match="same device"):
        tpu(torch.ones(3)) + torch.ones(3)


def test_item_and_print():
    t = tpu(torch.tensor([1.5, -2.25]))
    assert t[1].item() == -2.25
    s = str(tpu(torch.arange(3)))
    assert "device='tpu:0'" in s and "0, 1, 2" in s


def test_save_load(tmp_path):
    x = make((3, 4))
    t = tpu(x)
    buf = io.BytesIO()
    torch.save({"w": t, "v": t[1]}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["w"].device.type == "tpu"
    assert torch.equal(loaded["w"].cpu(), x)
    assert torch.equal(loaded["v"].cpu(), x[1])
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert torch.equal(on_cpu["w"], x)


def test_memory_stats():
    # A tensor counts from its first write (docs/reliability.md): empty alone
    # reserves nothing on the device.
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    t = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_allocated() == before
    t.fill_(1.0)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before + 4096
    del t
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.max_memory_allocated() >= before + 4096


def test_manual_seed_is_per_device_module():
    torch.tpu.manual_seed(3)
    s1 = torch.tpu.get_rng_state()
    torch.tpu.manual_seed(3)
    assert torch.equal(torch.tpu.get_rng_state(), s1)


@pytest.mark.strict_eager
def test_repeated_op_hits_cache(metrics_delta):
    x = tpu(make((5, 7)))
    x * 3.25  # first call may compile
    d0 = metrics_delta()
    for _ in range(5):
        x * 3.25
    d1 = metrics_delta()
    assert d1["xla_compiles"] == d0["xla_compiles"]
    assert d1["executable_cache_hits"] - d0["executable_cache_hits"] >= 5
    assert d1["executions"] - d0["executions"] == 5


def test_metrics_keys_and_transfer_bytes(metrics_delta):
    x = torch.ones(100)
    t = tpu(x)
    t.cpu()
    d = metrics_delta()
    assert d["host_to_device_bytes"] >= 400 and d["device_to_host_bytes"] >= 400
    for key in ("xla_compiles", "executable_cache_hits", "executions",
                "host_to_device_bytes", "device_to_host_bytes"):
        assert key in torch_pjrt.metrics()


def test_invalid_device_index():
    with pytest.raises(RuntimeError, match="invalid device index 7"):
        torch.zeros(2, device="tpu:7")
    with pytest.raises(RuntimeError, match="invalid device index"):
        torch.tpu.set_device(9)
    # As CUDA's: an index past the devices is an error, not a silent no-op
    # (synchronize(7) returned, get_device_name(9) named a platform).
    for call in (torch.tpu.synchronize, torch.tpu.get_device_name, torch.tpu.current_stream,
                 torch.tpu.memory_allocated):
        with pytest.raises(RuntimeError, match="invalid device index 9"):
            call(9)
        with pytest.raises(RuntimeError, match="invalid device index 9"):
            call("tpu:9")
    torch.tpu.synchronize(-1)  # every device


def test_record_stream_is_accepted():
    # FSDP and communication hooks written for CUDA call it; PJRT keeps a
    # buffer alive while queued work reads it, so there is nothing to record.
    x = tpu(torch.arange(4.0))
    x.record_stream(torch.tpu.current_stream())
    x.record_stream(torch.tpu.Stream())
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(RuntimeError, match="expected a stream of tpu:0"):
        x.record_stream(torch.Stream(device="cpu"))


def test_resize_past_the_address_space_raises_as_cpu():
    for size in (2**62, 2**61):
        t, c = tpu(torch.zeros(6)), torch.zeros(6)
        with pytest.raises(RuntimeError, match="Storage size calculation overflowed") as cpu_err:
            c.resize_(size)
        with pytest.raises(type(cpu_err.value), match="Storage size calculation overflowed"):
            t.resize_(size)
        assert t.shape == (6,) and t.untyped_storage().nbytes() == 24
    with pytest.raises(RuntimeError):
        tpu(torch.zeros(6)).resize_(-1)


def test_storage_slices_name_what_to_do():
    s = tpu(torch.arange(4.0)).untyped_storage()
    with pytest.raises(RuntimeError, match=r"slice of a tpu storage.*view of the tensor"):
        s[:4].tolist()
    assert s[4] == torch.arange(4.0).untyped_storage()[4]


def test_jit_trace_of_convolutions_records_them():
    # The tracer records _convolution, which convolution's PyTorch kernel
    # calls; a lowered convolution skipped it, and tracing failed ("Cannot
    # insert a Tensor that requires grad as a constant").
    import copy
    for m, shape in ((torch.nn.Conv1d(2, 3, 2), (1, 2, 5)), (torch.nn.Conv2d(2, 2, 3), (1, 2, 5, 5)),
                     (torch.nn.ConvTranspose2d(2, 2, 3), (1, 2, 4, 4))):
        x = torch.randn(shape)
        traced = torch.jit.trace(copy.deepcopy(m).to("tpu"), (tpu(x),))
        assert "aten::_convolution" in str(traced.graph)
        y = torch.randn(shape)
        torch.testing.assert_close(traced(tpu(y)).cpu(), m(y).detach(), rtol=1e-5, atol=1e-5)


def test_incompatible_shapes_raise_like_cpu():
    a, b = make((3, 4)), make((5,))
    with pytest.raises(RuntimeError) as cpu_err:
        a + b
    with pytest.raises(type(cpu_err.value), match="must match the size"):
        tpu(a) + tpu(b)


def test_unknown_plugin_name():
    r = run_python("import torch_pjrt", TORCH_PJRT_PLUGIN="nosuch")
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "unknown PJRT plugin name 'nosuch'" in r.stderr


def test_missing_plugin_file():
    r = run_python("import torch_pjrt", TORCH_PJRT_PLUGIN="/nonexistent/plugin.so")
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "/nonexistent/plugin.so" in r.stderr


@cpu_plugin_only
def test_plugin_by_path_and_device_count():
    import xla_plugins
    path = os.path.join(os.path.dirname(xla_plugins.__path__[0]), "xla_plugins", "xla_cpu_pjrt",
                        "xla_cpu_pjrt.so")
    r = run_python("import torch, torch_pjrt; print(torch.tpu.device_count(), "
                   "(torch.ones(2, device='tpu') * 2).cpu().tolist())",
                   TORCH_PJRT_PLUGIN=path, TORCH_PJRT_CPU_DEVICES="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "3" and "[2.0, 2.0]" in r.stdout


def test_dispatch_is_asynchronous(metrics_delta):
    x = tpu(make((64, 64)))
    for _ in range(10):
        x = x * 1.01 + 0.5
    assert metrics_delta()["host_waits"] == 0  # nothing waited for the device yet
    x.cpu()
    assert metrics_delta()["host_waits"] == 1


def test_plugin_error_becomes_runtime_error():
    from torch_pjrt import _state
    with pytest.raises(RuntimeError, match=r"compile failed in PJRT plugin '\w+': .*garbage"):
        _state.C.compile_program("garbage")
    ok = ('module @m { func.func public @main(%a: tensor<2xf32>) -> (tensor<2xf32>) {'
          ' "func.return"(%a) : (tensor<2xf32>) -> () } }')
    assert _state.C.compile_program(ok) == 1


def test_non_blocking_copies_and_pinned_memory():
    x = make((4, 3))
    host = tpu(x).to("cpu", non_blocking=True)  # lands in pinned host memory
    torch.tpu.synchronize()
    assert host.is_pinned() and torch.equal(host, x)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert_same(pinned.to("tpu", non_blocking=True), x)


def test_storage_resize_frees_and_regrows_keeping_the_prefix():
    # Storage.resize_ on tpu: what FSDP2 does to free an unsharded parameter
    # (resize_(0)) and bring it back before gathering into it.
    cpu_t = torch.arange(6.0)
    t = cpu_t.to("tpu")
    before = torch.tpu.memory_allocated()
    t.untyped_storage().resize_(0)
    assert t.untyped_storage().nbytes() == 0
    assert torch.tpu.memory_allocated() <= before - 24
    t.untyped_storage().resize_(24)
    t.copy_(torch.ones(6))
    assert torch.equal(t.cpu(), torch.ones(6))
    u = torch.arange(8.0).to("tpu")
    u.untyped_storage().resize_(16)  # shrink: the first 4 values stay
    assert torch.equal(torch.empty(0, device="tpu").set_(u.untyped_storage(), 0, (4,), (1,)).cpu(), torch.arange(4.0))
    u.untyped_storage().resize_(40)  # grow: the first 4 values stay
    assert torch.equal(torch.empty(0, device="tpu").set_(u.untyped_storage(), 0, (4,), (1,)).cpu(), torch.arange(4.0))
    with pytest.raises(NotImplementedError, match="split an element"):
        u.untyped_storage().resize_(6)


@cpu_plugin_only
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reads_of_computed_values_in_host_memory(dtype, metrics_delta):
    # The CPU plugin's buffers are host memory: a ready buffer is copied in
    # place instead of through the plugin's transfer (a worker thread). The
    # values must be those of the transfer: computed on the device (not just
    # uploaded), read whole, as a view and as a scalar.
    x = make((6, 5), dtype=dtype)
    t = tpu(x)
    y = torch.flip(t, [0]) if dtype != torch.bool else ~t
    ref = torch.flip(x, [0]) if dtype != torch.bool else ~x
    d0 = metrics_delta()
    assert torch.equal(y.cpu(), ref)
    assert torch.equal(y[1:, ::2].cpu(), ref[1:, ::2])
    assert y[2, 3].item() == ref[2, 3].item()
    d1 = metrics_delta()
    assert d1["host_reads_in_place"] - d0["host_reads_in_place"] >= 3


def test_a_read_of_a_failed_computation_raises_not_garbage():
    # The read waits for the buffer to be ready and raises the error that
    # kept it from being made (here an index out of range, as a device check).
    x = tpu(make((4,)))
    bad = tpu(torch.tensor([0, 9]))
    y = x[bad] * 2
    with pytest.raises(IndexError):
        y.cpu()
    torch.testing.assert_close((x + 1).cpu(), make((4,)) + 1)


def test_small_uploads_are_private_copies_not_views_of_host_memory():
    # The host tensor changed or freed right after a host-to-device copy must
    # not change what the device holds, at every size (small copies were once
    # left to finish in the background from a private copy of the bytes) and
    # each dtype.
    kept = []
    for n in (1, 7, 1024, 16384, 16385, 70000):
        for dtype in (torch.float32, torch.int64, torch.uint8, torch.bool):
            x = make((n,), dtype=dtype)
            ref = x.clone()
            t = x.to("tpu")
            x.zero_() if dtype != torch.bool else x.logical_not_()
            del x
            kept.append((t, ref))
    for t, ref in kept:
        assert torch.equal(t.cpu(), ref)
    # Many in flight at once, read in reverse order after device work on them.
    hosts = [torch.full((3,), float(i)) for i in range(300)]
    devs = [h.to("tpu") for h in hosts]
    for h in hosts:
        h.fill_(-1.0)
    del hosts
    sums = [d.sum() for d in devs]
    for i in reversed(range(300)):
        assert sums[i].item() == 3.0 * i


def test_sparse_gradients_raise_a_clear_not_implemented_error():
    emb = torch.nn.Embedding(10, 3, sparse=True).to("tpu")
    with pytest.raises(NotImplementedError, match=r"sparse tensors are not supported on device tpu.*sparse=False"):
        emb(torch.tensor([7, 1, 3], device="tpu")).sum().backward()
    dense = torch.nn.Embedding(10, 3).to("tpu")  # the dense gradient works
    dense(torch.tensor([7, 1, 3], device="tpu")).sum().backward()
    assert dense.weight.grad.cpu()[7].tolist() == [1.0, 1.0, 1.0]


def test_pickle_and_the_legacy_save_format_round_trip():
    # pickle.dumps (Storage.__reduce__) and torch.save's pre-zip format write
    # and read storages through at::from_blob at their address, which on tpu
    # names no memory: they raised. Now through a CPU copy (_legacy_save.py),
    # keeping views, shared storages, dtypes, Parameters and the device.
    import pickle
    t = tpu(torch.arange(6.0).reshape(2, 3))
    v = t[:, 1:]
    r = pickle.loads(pickle.dumps(v))
    assert r.device == v.device and r.stride() == v.stride() and r.storage_offset() == 1
    assert_same(r, v.cpu())
    m = torch.nn.Linear(3, 2).to("tpu")
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.weight.device.type == "tpu" and isinstance(m2.weight, torch.nn.Parameter)
    assert_same(m2.weight, m.weight.detach().cpu())
    for dtype in (torch.bfloat16, torch.int64, torch.bool):
        x = tpu(make((5,), dtype, seed=3))
        assert_same(pickle.loads(pickle.dumps(x)), x.cpu())
    b = io.BytesIO()
    torch.save({"a": t, "b": v}, b, _use_new_zipfile_serialization=False)
    b.seek(0)
    d = torch.load(b, weights_only=False)
    assert d["a"].device == t.device and d["b"].untyped_storage().data_ptr() == d["a"].untyped_storage().data_ptr()
    assert_same(d["b"], v.cpu())
    b.seek(0)
    assert torch.load(b, map_location="cpu", weights_only=False)["a"].device.type == "cpu"
    # from_blob over a tpu address still names no memory: a clear error.
    with pytest.raises(RuntimeError, match="from_blob"):
        torch.UntypedStorage._write_file.__wrapped__(t.untyped_storage(), io.BytesIO(), False, True, 4)


def test_dlpack_export_is_refused_at_the_export():
    # A capsule would carry an opaque storage handle as its data pointer.
    from torch.utils.dlpack import to_dlpack
    x = tpu(torch.arange(5.0))
    for export in (to_dlpack, lambda t: t.__dlpack__(), lambda t: t.__dlpack__(max_version=(1, 0))):
        with pytest.raises(BufferError, match="cannot export a tensor on tpu:0 through DLPack"):
            export(x)
    with pytest.raises(BufferError, match="cannot export a tensor on tpu:0 through DLPack"):
        torch.from_dlpack(x)  # asks __dlpack_device__ first, which knew no "tpu" (a ValueError)
    assert torch.equal(torch.from_dlpack(to_dlpack(torch.arange(3.0))), torch.arange(3.0))  # CPU unaffected


def test_sparse_compressed_layouts_raise_a_clear_error():
    x = tpu(torch.eye(3))
    for make in (lambda t: t.to_sparse_csr(), lambda t: t.to_sparse_csc(), lambda t: t.to_sparse_bsr(1)):
        with pytest.raises(NotImplementedError, match="sparse tensors are not supported on device tpu"):
            make(x)
    # One made another way (moved from the CPU) gets the same error at its first use.
    csr = torch.eye(3).to_sparse_csr().to("tpu")
    with pytest.raises(NotImplementedError, match="sparse tensors are not supported on device tpu"):
        csr.to_dense()


def test_quantized_tensors_raise_a_clear_error():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation is deprecated in PyTorch
        q = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8)
        for make in (lambda: q.to("tpu"), lambda: torch.empty(2, dtype=torch.qint8, device="tpu"),
                     lambda: torch.quantize_per_tensor(tpu(torch.randn(3)), 0.1, 0, torch.quint8)):
            with pytest.raises(NotImplementedError, match="quantized tensors are not supported on device tpu"):
                make()
    assert torch.equal(q.dequantize().to("tpu").cpu(), q.dequantize())


def test_set_storage_as_cpu():
    # set_(storage, offset, size) without strides is contiguous; CPU's checks
    # and messages for the offset, the stride length and the storage's device.
    def both(fn):
        want = fn("cpu")
        got = fn("tpu")
        assert got.shape == want.shape and got.stride() == want.stride()
        assert got.storage_offset() == want.storage_offset()
        assert_same(got, want)

    def source(d):
        return torch.arange(12.0, device=d).untyped_storage()

    both(lambda d: torch.empty(3, 4, device=d).set_(source(d), 0, (3, 4)))
    both(lambda d: torch.empty(0, device=d).set_(source(d), 2, (2, 3)))
    both(lambda d: torch.empty(0, device=d).set_(source(d), 0, (2, 0, 3)))
    both(lambda d: torch.empty(0, device=d).set_(source(d), 5, ()))
    both(lambda d: torch.empty(0, device=d).set_(source(d), 1, (3, 2), (1, 3)))
    for bad in ((-1, (2, 3)), (0, (2, 3), (1,))):
        with pytest.raises(RuntimeError) as cpu_err:
            torch.empty(0).set_(source("cpu"), *bad)
        with pytest.raises(RuntimeError) as tpu_err:
            torch.empty(0, device="tpu").set_(source("tpu"), *bad)
        assert str(tpu_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]
    with pytest.raises(RuntimeError, match="different device"):
        torch.empty(0, device="tpu").set_(source("cpu"), 0, (2, 3))


def test_functional_copy_takes_cpu_data_as_cuda_does():
    # aten.copy (functionalized copy_) between tpu and CPU tensors: PyTorch's
    # own composite kernel (clone + copy_) moves the data, as on CUDA; other
    # routed ops with CPU data still raise CUDA's mixed-device error.
    a = torch.arange(6.0).reshape(2, 3)
    t = tpu(a)
    r = torch.ops.aten.copy(t, a * 2)
    assert r.device == t.device and torch.equal(r.cpu(), a * 2)
    r = torch.ops.aten.copy(a, t * 3)
    assert r.device.type == "cpu" and torch.equal(r, a * 3)
    out = torch.func.functionalize(lambda d, s: d.copy_(s))(t.clone(), a + 1)
    assert torch.equal(out.cpu(), a + 1)
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(t, a)
    assert torch.equal(torch.mul(t, torch.tensor(2.0)).cpu(), a * 2)  # a CPU scalar is fine
