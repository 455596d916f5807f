"""Mixed precision on tpu: torch.autocast("tpu") casts like PyTorch's CUDA
policy, and torch.amp.GradScaler("tpu") unscales, skips and rescales on the device."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_same, make, tpu

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_policies_match_cpu(dtype):
    lin = nn.Linear(6, 5)
    x = make((3, 6))
    lin_t = copy.deepcopy(lin).to("tpu")
    with torch.autocast("cpu", dtype=dtype):
        y_c = lin(x)
    p_c = torch.softmax(y_c.float(), -1)  # CUDA's policy (ours): softmax in float32
    with torch.autocast("tpu", dtype=dtype):
        y_t = lin_t(tpu(x))
        p_t = torch.softmax(y_t, -1)
    assert y_t.dtype == dtype and p_t.dtype == torch.float32  # matmul low, softmax fp32
    assert_same(y_t, y_c, rtol=1e-2, atol=1e-2)
    assert_same(p_t, p_c, rtol=1e-2, atol=1e-2)


def test_autocast_training_step_gives_float32_grads():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu")
    x, y = tpu(make((5, 8))), torch.tensor([0, 1, 2, 3, 0], device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    assert loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def _scaler_run(device, poison_step):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 8, growth_interval=2)
    scales = []
    for step in range(5):
        opt.zero_grad()
        loss = model(make((2, 4), seed=step).to(device)).pow(2).sum()
        scaler.scale(loss).backward()
        if step == poison_step:
            model.weight.grad[0, 0] = float("inf")  # an overflow: this step is skipped
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach() for p in model.parameters()], scales


def test_grad_scaler_matches_cpu():
    params_c, scales_c = _scaler_run("cpu", poison_step=2)
    params_t, scales_t = _scaler_run("tpu", poison_step=2)
    assert scales_t == scales_c  # grows every 2 clean steps, halves after the overflow
    for a, b in zip(params_t, params_c):
        assert_same(a, b)
