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
