"""Host state a captured step depends on that its trace cannot show.

A replay runs only the step's tpu program, so Python numbers it read while
recording are baked in. The ones that change in practice are an optimizer's
hyperparameters (a learning-rate schedule): a recording notes the values of
each optimizer the step stepped, and a replay first checks they are still
the same (else the step is recorded again). An LR scheduler stepped inside
the step would never advance on replay: that makes the recording
unreplayable.
"""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


def _hyper(opt):
    """An optimizer's host hyperparameters (lr, betas, ...), per group."""
    return tuple(tuple((k, v) for k, v in g.items() if k != "params" and not isinstance(v, torch.Tensor))
                 for g in opt.param_groups)


def _scheduler_classes():
    """LRScheduler and its subclasses that define step themselves."""
    from torch.optim.lr_scheduler import LRScheduler
    found, stack = [LRScheduler], list(LRScheduler.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "step" in cls.__dict__:
            found.append(cls)
    return found


class Watch:
    """Watches one recording: `with Watch() as w: step(...)`; then
    `w.problem` (why it cannot be replayed, or None) and `w.optimizers`
    (what a replay checks with `unchanged`)."""

    def __init__(self):
        self.optimizers = []  # (weakref to the optimizer, its hyperparameters when it stepped)
        self.problem = None
        self._hook = None
        self._patched = []

    def __enter__(self):
        self._hook = register_optimizer_step_pre_hook(self._pre_step)
        for cls in _scheduler_classes():
            original = cls.__dict__["step"]

            def step(sched, *args, _original=original, **kwargs):
                self.problem = self.problem or (
                    f"an LR scheduler ({type(sched).__name__}) steps inside the step, and a replay would not "
                    "advance it: call its step() outside the captured step")
                return _original(sched, *args, **kwargs)
            cls.step = step
            self._patched.append((cls, original))
        return self

    def __exit__(self, *exc):
        self._hook.remove()
        for cls, original in self._patched:
            cls.step = original
        self._patched.clear()
        for ref, before in self.optimizers:
            opt = ref()
            if opt is not None and _hyper(opt) != before and self.problem is None:
                self.problem = (f"the step changes its optimizer's hyperparameters ({type(opt).__name__}"
                                ".param_groups), and a replay would not")
        return False

    def _pre_step(self, opt, args, kwargs):
        if all(ref() is not opt for ref, _ in self.optimizers):
            self.optimizers.append((weakref.ref(opt), _hyper(opt)))


def unchanged(optimizers):
    """Whether every optimizer a recording stepped still has the
    hyperparameters it had then (and is alive)."""
    for ref, before in optimizers:
        opt = ref()
        if opt is None or _hyper(opt) != before:
            return False
    return True
