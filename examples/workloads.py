"""The shipped models as assessment workloads (python -m torch_pjrt assess
examples/workloads.py:gpt --out report/). Each function returns a
torch_pjrt.assess.Workload; write one like these for your own model."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

from torch_pjrt.assess import Workload  # noqa: E402


def _gpt():
    torch.manual_seed(0)  # the same initial weights in every process
    return models.GPT()


def gpt():
    """The small GPT, training (AdamW): loss curve and step times."""
    text = models.gpt_text()

    def make_inputs(batch_size):
        x, y = models.gpt_batch(0, batch=batch_size, text=text)
        return x, y

    return Workload(
        name="gpt (training)", model=_gpt, make_inputs=make_inputs, mode="training",
        loss_fn=lambda loss, targets: loss,  # GPT(x, y) returns its cross-entropy loss
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
        train_steps=10, batch_sizes=(1, 2, 4, 8))


def gpt_inference():
    """The small GPT, next-token logits (top-1 agreement between the sides)."""
    text = models.gpt_text()
    return Workload(name="gpt (inference)", model=_gpt,
                    make_inputs=lambda b: models.gpt_batch(0, batch=b, text=text)[0],
                    mode="inference", batch_sizes=(1, 2, 4, 8))


def cnn():
    """The small CNN with batch norm, inference on images (top-1 agreement)."""
    def model():
        torch.manual_seed(0)
        return models.SmallCNN()

    return Workload(name="cnn (inference)", model=model,
                    make_inputs=lambda b: models.cnn_batch(0, batch=b)[0],
                    mode="inference", batch_sizes=(1, 4, 16))


def cnn_training():
    def model():
        torch.manual_seed(0)
        return models.SmallCNN()

    return Workload(name="cnn (training)", model=model, make_inputs=lambda b: models.cnn_batch(0, batch=b)[0],
                    make_targets=lambda b: models.cnn_batch(0, batch=b)[1], mode="training",
                    loss_fn=lambda logits, labels: F.cross_entropy(logits, labels),
                    optimizer=lambda ps: torch.optim.Adam(ps, lr=3e-3), batch_sizes=(4, 16))
