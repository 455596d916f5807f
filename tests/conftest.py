"""Shared test helpers: every tpu result is compared with PyTorch on CPU."""
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A fused trace due to compile gets its program at once, compiled on the
# caller, so that tests counting fused runs, deferred compiles and cache hits
# do not depend on a compile thread's timing. Users' default (auto) compiles
# the program of a trace outside a tight loop on a compile thread while the
# trace runs op by op; tests/test_fused_background_compile.py covers it.
os.environ.setdefault("TORCH_PJRT_FUSED_BACKGROUND_COMPILE", "off")
# The persistent executable cache stays at its default (the user cache dir,
# see torch_pjrt/cache.py) on purpose: a rerun loads what earlier runs compiled
# (about twice as fast). TORCH_PJRT_CACHE_DIR="" makes a run compile everything;
# tests/test_persistent_cache.py uses directories of its own.
import torch_pjrt  # noqa: E402,F401  (registers the tpu device)

DEVICE = "tpu"
FUSED = os.environ.get("TORCH_PJRT_EAGER") == "fused"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "strict_eager: counts what strict eager launches or compiles per op (one program per op); "
        "skipped when the suite runs with TORCH_PJRT_EAGER=fused")


def pytest_collection_modifyitems(config, items):
    if not FUSED:
        return
    skip = pytest.mark.skip(reason="counts strict-eager launches (TORCH_PJRT_EAGER=fused records ops instead)")
    for item in items:
        if "strict_eager" in item.keywords:
            item.add_marker(skip)

# Tolerances per dtype (rtol, atol). XLA's CPU kernels use their own
# approximations of transcendental functions, so float32 gets a little more
# room than PyTorch's default (1.3e-6, 1e-5).
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]


def tpu(x):
    """Moves tensors (or nested lists/tuples of them) to the tpu device."""
    if isinstance(x, torch.Tensor):
        return x.to(DEVICE)
    if isinstance(x, (list, tuple)):
        return type(x)(tpu(e) for e in x)
    return x


def cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(cpu(e) for e in x)
    return x


def assert_same(actual, expected, rtol=None, atol=None, check_stride=False):
    """tpu result vs CPU result: same dtype, shape, values within the dtype's tolerance."""
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol, check_stride)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == pytest.approx(expected)
        return
    assert actual.device.type == DEVICE, f"result on {actual.device}, expected tpu"
    a = actual.cpu()
    assert a.dtype == expected.dtype, f"dtype {a.dtype} != {expected.dtype}"
    assert a.shape == expected.shape, f"shape {tuple(a.shape)} != {tuple(expected.shape)}"
    r, t = TOLERANCES.get(expected.dtype, (0, 0))
    torch.testing.assert_close(a, expected, rtol=r if rtol is None else rtol,
                               atol=t if atol is None else atol, equal_nan=True)
    if check_stride:
        assert a.stride() == expected.stride()


def make(shape, dtype=torch.float32, low=-3, high=3, seed=0, noncontiguous=False):
    """Deterministic CPU test data; noncontiguous=True gives a strided view."""
    g = torch.Generator().manual_seed(seed)
    full = list(shape)
    if noncontiguous and full:
        full[-1] = full[-1] * 2
    if dtype == torch.bool:
        t = torch.randint(0, 2, full, generator=g).bool()
    elif dtype.is_floating_point:
        t = (torch.rand(full, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    else:
        lo = 0 if dtype == torch.uint8 else low
        t = torch.randint(lo, high + 1, full, generator=g).to(dtype)
    if noncontiguous and full:
        t = t[..., ::2]
        assert not t.is_contiguous() or t.numel() <= 1
    return t


@pytest.fixture
def metrics_delta():
    """Returns a function giving the change in torch_pjrt.metrics() since the fixture began."""
    before = torch_pjrt.metrics()

    def delta():
        now = torch_pjrt.metrics()
        out = {k: now[k] - before[k] for k in now if not isinstance(now[k], dict)}
        out["cpu_fallbacks"] = {op: n - before["cpu_fallbacks"].get(op, 0)
                                for op, n in now["cpu_fallbacks"].items()
                                if n != before["cpu_fallbacks"].get(op, 0)}
        return out
    return delta


@pytest.fixture
def no_cpu_fallback():
    """Fails the test if any op ran through the CPU fallback."""
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    yield
    after = torch_pjrt.metrics()["cpu_fallbacks"]
    fell_back = sorted(op for op, n in after.items() if n != before.get(op, 0))
    assert not fell_back, f"ran on CPU: {fell_back}"


def run_python(code, timeout=120, **env):
    """Runs `code` in a fresh interpreter (for settings read once per process)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    full_env.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def run_json(code, timeout=600, **env):
    """run_python, which must succeed and print one line "RESULT <json>"; returns the json."""
    import json
    r = run_python(code, timeout=timeout, **env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def check_raises(fn, *inputs):
    """fn raises on tpu inputs the same exception type as on the CPU inputs."""
    with pytest.raises(Exception) as cpu_err:
        fn(*inputs)
    with pytest.raises(cpu_err.type):
        fn(*tpu(inputs))


def run_with_grads(fn, inputs, device):
    """fn on `inputs` moved to `device` (floating tensors require grad), then a
    backward with a fixed random cotangent: (output, input grads)."""
    args = [x.detach().to(device).requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
            for x in inputs]
    y = fn(*args)
    grads = []
    if y.requires_grad:
        y.backward(make(y.shape, y.dtype, low=-1, high=1, seed=7).to(device))
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return y.detach(), grads


def check(fn, *inputs, rtol=None, atol=None):
    """Output and the grads of every floating-point input on tpu match CPU."""
    expected = run_with_grads(fn, inputs, "cpu")
    actual = run_with_grads(fn, inputs, "tpu")
    assert_same(actual[0], expected[0], rtol, atol)
    assert_same(actual[1], expected[1], rtol, atol)
