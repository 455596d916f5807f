"""One call of a workload on a device, the same on every side and stage:
inference (forward under no_grad), a training step (forward, loss, backward,
optimizer step) or greedy generation; eager or torch.compile'd; each call
ends when the device is done (a host wait), so it can be timed."""
import torch

from .workload import call


def baseline_device(setting):
    if setting != "auto":
        return setting
    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(device):
    kind = torch.device(device).type
    if kind == "tpu":
        torch.tpu.synchronize()
    elif kind == "cuda":
        torch.cuda.synchronize()


class Runner:
    """model (a fresh copy, moved to `device`) and its step for `frontend`
    ("eager", "compiled" with backend "tpu" on tpu / inductor elsewhere)."""

    def __init__(self, workload, device, frontend="eager"):
        self.workload, self.device, self.frontend = workload, device, frontend
        self.model = workload.build_model().to(device)
        self.forward = self.model
        self.optimizer = None
        if workload.mode == "training":
            make_opt = workload.optimizer or (lambda params: torch.optim.SGD(params, lr=1e-2))
            self.optimizer = make_opt(self.model.parameters())
        self.opt_step = self.optimizer.step if self.optimizer else None
        if frontend == "compiled":
            backend = "tpu" if torch.device(device).type == "tpu" else "inductor"
            if workload.mode == "generation":  # generate() calls the model's own forward
                self.model.forward = torch.compile(self.model.forward, backend=backend)
            else:
                self.forward = torch.compile(self.model, backend=backend)
            if self.optimizer:
                self.opt_step = torch.compile(self.optimizer.step, backend=backend)

    def inputs(self, batch_size):
        """One call's batch on the device (training: (inputs, targets))."""
        x = self.workload.inputs(batch_size, self.device)
        if self.workload.mode == "training":
            return x, self.workload.inputs(batch_size, self.device, targets=True)
        return x

    def __call__(self, batch):
        """One call; returns its outputs (training: (outputs, loss))."""
        w = self.workload
        inputs = batch
        if w.mode == "training":
            inputs, targets = batch
            self.optimizer.zero_grad(set_to_none=True)
            out = call(self.forward, inputs)
            loss = w.loss_fn(out, targets)
            loss.backward()
            self.opt_step()
            result = (out, loss.detach())
        elif w.mode == "generation":
            with torch.no_grad():
                kwargs = dict(inputs) if isinstance(inputs, dict) else {"input_ids": inputs}
                config = getattr(self.model, "generation_config", None)
                pad = getattr(config, "pad_token_id", None)
                if pad is None:
                    pad = getattr(config, "eos_token_id", None)
                    pad = pad[0] if isinstance(pad, (list, tuple)) else pad
                result = self.model.generate(**kwargs, max_new_tokens=w.max_new_tokens, do_sample=False,
                                             min_new_tokens=w.max_new_tokens, pad_token_id=pad)
        else:
            with torch.no_grad():
                result = call(self.forward, inputs)
        synchronize(self.device)
        return result
