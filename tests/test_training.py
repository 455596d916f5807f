"""Small models train on tpu from the same weights and data as on CPU: the
first-step loss agrees to 1e-4, the final loss within a few percent, the loss
falls, and nothing runs on the CPU fallback."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import models  # noqa: E402

STEPS = {"mlp": 30, "cnn": 20, "gpt": 20}


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_model_trains_like_cpu(kind, metrics_delta):
    steps = STEPS[kind]
    cpu = models.train(kind, "cpu", steps)
    tpu = models.train(kind, "tpu", steps)
    assert metrics_delta()["cpu_fallbacks"] == {}
    assert abs(tpu[0] - cpu[0]) < 1e-4, (tpu[0], cpu[0])
    assert abs(tpu[-1] - cpu[-1]) / cpu[-1] < 0.03, (tpu[-1], cpu[-1])
    tail = sum(tpu[-3:]) / 3
    assert tail < tpu[0], f"loss did not fall: {tpu[0]:.4f} -> {tail:.4f}"


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices")
def test_training_on_second_device_matches_first(metrics_delta):
    first = models.train("cnn", "tpu:0", 3)
    second = models.train("cnn", "tpu:1", 3)
    assert second == pytest.approx(first, abs=1e-6)
    assert metrics_delta()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant", "sequential"])
def test_activation_checkpointing_with_dropout_recomputes_the_same_mask(mode):
    # torch.utils.checkpoint saves the device's RNG state only if
    # torch.tpu._initialized: without it the recomputed dropout drew another
    # mask, and the gradients were silently wrong (HF gradient checkpointing).
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.ReLU(),
                              torch.nn.Linear(32, 16), torch.nn.Dropout(0.3)).to("tpu")
    x = torch.randn(8, 16, device="tpu")

    def run(ckpt):
        torch.tpu.manual_seed(1234)
        xi = x.clone().requires_grad_()
        if not ckpt:
            y = net(xi)
        elif mode == "sequential":
            y = checkpoint_sequential(net, 2, xi, use_reentrant=False)
        else:
            y = checkpoint(net, xi, use_reentrant=mode == "reentrant")
        (y * torch.arange(16.0, device="tpu")).sum().backward()
        grads = [xi.grad] + [p.grad.clone() for p in net.parameters()]
        net.zero_grad()
        return y.detach().cpu(), [g.cpu() for g in grads]

    y0, g0 = run(False)
    y1, g1 = run(True)
    assert torch.equal(y0, y1)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
