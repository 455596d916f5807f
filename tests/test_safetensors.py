"""safetensors with tpu tensors (torch_pjrt/integrations/safetensors.py)."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import DEVICE

safetensors = pytest.importorskip("safetensors")
import safetensors.torch  # noqa: E402

from torch_pjrt.integrations import safetensors as st  # noqa: E402

# Bit patterns compared through same-width integer views (NaN payloads, -0.0, inf, subnormals).
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]


def sample(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype == torch.int64:
        t = torch.randint(-2**62, 2**62, shape, generator=g, dtype=torch.int64)
        t[0, 0], t[0, 1] = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min
        return t
    t = torch.randn(shape, generator=g).to(dtype)
    t.view(-1)[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0,
                                   torch.finfo(dtype).tiny / 4]).to(dtype)
    return t


def sample_dict():
    d = {f"t_{str(dt).split('.')[-1]}": sample(dt) for dt in DTYPES}
    d["scalar"] = torch.tensor(2.5)
    d["empty"] = torch.zeros(0, 4, dtype=torch.bfloat16)
    d["big"] = torch.arange(4096 * 3, dtype=torch.float32).reshape(3, 4096)
    return d


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.cpu(), expected.cpu()
    if e.dtype in BITS:
        a, e = a.view(BITS[e.dtype]), e.view(BITS[e.dtype])
    assert torch.equal(a, e)


@pytest.mark.parametrize("device", [DEVICE, "tpu:1", torch.device(DEVICE, 0)])
def test_stock_safetensors_loads_onto_tpu(tmp_path, device):
    """Libraries call stock safetensors with the device they are given
    (accelerate's load_state, load_checkpoint_and_dispatch): its safe_open,
    load_file and load_model take tpu devices once torch_pjrt is loaded."""
    want = torch.device(device)
    if want.index is not None and want.index >= torch.tpu.device_count():
        pytest.skip("needs a second tpu device")
    ref = sample_dict()
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file(ref, path)
    got = safetensors.torch.load_file(path, device=device)       # safe_open(...).get_tensors()
    with safetensors.safe_open(path, framework="pt", device=device) as f:
        one = f.get_tensor("t_float16")
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].device.type == DEVICE and (want.index is None or got[k].device == want), k
        assert_bits_equal(got[k], ref[k])
    assert one.device.type == DEVICE
    assert_bits_equal(one, ref["t_float16"])
    src = torch.nn.Linear(4, 3)
    safetensors.torch.save_model(src, tmp_path / "m.safetensors")
    dst = torch.nn.Linear(4, 3).to(device)
    safetensors.torch.load_model(dst, tmp_path / "m.safetensors", device=device)
    assert_bits_equal(dst.weight.detach(), src.weight.detach())
    # Other devices are safetensors' own business, errors included.
    assert safetensors.torch.load_file(path)["t_float32"].device.type == "cpu"
    with pytest.raises(Exception, match="invalid"):
        safetensors.torch.load_file(path, device="bogus")


def test_stock_safetensors_rejects_tpu_string_without_the_integration(tmp_path):
    """What patch_stock is for: safetensors 0.8 validates device strings itself."""
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2)}, path)
    code = ("import torch, torch_pjrt, safetensors.torch as s\n"
            f"try:\n    s.load_file({str(path)!r}, device='tpu')\nexcept Exception as e:\n    print('raised', e)")
    env = dict(os.environ, TORCH_PJRT_HF_INTEGRATION="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "raised" in out.stdout and "invalid" in out.stdout, out.stdout + out.stderr


def test_stock_safetensors_integer_device_is_current_accelerator(tmp_path):
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2)}, path)
    if torch.accelerator.current_accelerator().type != DEVICE:
        pytest.skip("tpu is not PyTorch's current accelerator here")
    assert safetensors.torch.load_file(path, device=0)["a"].device == torch.device(DEVICE, 0)


@pytest.mark.parametrize("device", [DEVICE, "tpu:0", torch.device(DEVICE, 1)])
def test_load_file_onto_tpu(tmp_path, device):
    if torch.device(device).index is not None and torch.device(device).index >= torch.tpu.device_count():
        pytest.skip("needs a second tpu device")
    ref = sample_dict()
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file(ref, path, metadata={"format": "pt"})
    got = st.load_file(path, device=device)
    assert got.keys() == ref.keys()
    want = torch.device(device)
    for k in ref:
        assert got[k].device.type == DEVICE and (want.index is None or got[k].device == want), k
        assert_bits_equal(got[k], ref[k])


def test_save_file_of_tpu_tensors_round_trip(tmp_path):
    ref = sample_dict()
    path = tmp_path / "y.safetensors"
    st.save_file({k: v.to(DEVICE) for k, v in ref.items()}, path)
    back_cpu = safetensors.torch.load_file(path)          # written bytes equal the CPU file's
    for k in ref:
        assert_bits_equal(back_cpu[k], ref[k])
    cpu_path = tmp_path / "z.safetensors"
    safetensors.torch.save_file(ref, cpu_path)
    assert path.read_bytes() == cpu_path.read_bytes()
    back = st.load_file(path)
    for k in ref:
        assert back[k].device.type == DEVICE
        assert_bits_equal(back[k], ref[k])


def test_save_and_load_bytes():
    ref = sample_dict()
    data = st.save({k: v.to(DEVICE) for k, v in ref.items()})
    got = st.load(data)
    for k in ref:
        assert got[k].device.type == DEVICE
        assert_bits_equal(got[k], ref[k])


def test_safe_open_is_lazy_per_tensor(tmp_path):
    import torch_pjrt
    ref = sample_dict()
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file(ref, path, metadata={"note": "hi"})
    before = torch_pjrt.metrics()["host_to_device_bytes"]
    with st.safe_open(path, framework="pt", device=DEVICE) as f:
        assert set(f.keys()) == set(ref)
        assert f.metadata() == {"note": "hi"}
        assert torch_pjrt.metrics()["host_to_device_bytes"] == before    # nothing moved yet
        t = f.get_tensor("t_bfloat16")
        assert t.device.type == DEVICE
        assert_bits_equal(t, ref["t_bfloat16"])
        moved = torch_pjrt.metrics()["host_to_device_bytes"] - before
        assert moved == t.numel() * t.element_size()
        sl = f.get_slice("big")
        assert sl.get_shape() == [3, 4096]
        part = sl[1:2, :8]
        assert part.device.type == DEVICE and part.shape == (1, 8)
        assert_bits_equal(part, ref["big"][1:2, :8])


def test_get_tensors_onto_tpu(tmp_path):
    """get_tensors (safetensors 0.8, what its load_file calls) moves every tensor."""
    ref = sample_dict()
    path = tmp_path / "x.safetensors"
    safetensors.torch.save_file(ref, path)
    with st.safe_open(path, framework="pt", device=DEVICE) as f:
        got = f.get_tensors()
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k].device.type == DEVICE, k
        assert_bits_equal(got[k], ref[k])


def test_load_model(tmp_path):
    src = torch.nn.Linear(4, 3).to(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_model(src, path)
    dst = torch.nn.Linear(4, 3, dtype=torch.bfloat16).to(DEVICE)
    st.load_model(dst, path)
    assert dst.weight.device.type == DEVICE
    assert_bits_equal(dst.weight.detach(), src.weight.detach())
