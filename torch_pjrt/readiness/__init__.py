"""TPU readiness without a TPU: will this model fit a TPU generation, and
roughly how fast might a step run there?

    import torch_pjrt.readiness as readiness
    r = readiness.check(model, (x,), topology="v5e:2x2", mode="training", chips=4)
    print(r.summary()); r.to_dict(); r.largest_batch

The programs torch.compile(backend="tpu") makes for one step are captured
without running (torch_pjrt/_compile/capture.py) and compiled for the named
topology by libtpu (an optional extra, loaded compile-only beside the plugin
that runs tensors). Memory figures are XLA's compiled statistics; times are a
roofline ESTIMATE from published peaks (roofline.py), never a measurement.
"""
from .core import Report, ProgramFigures  # noqa: F401
from .plugin import LibtpuMissing, available, install_hint  # noqa: F401


def check(model_or_fn, example_inputs, topology="v5e:2x2", mode="inference", optimizer=None, chips=None,
          loss_fn=None, find_largest_batch=False, save_dir=None, max_batch=1 << 20):
    """Compiles one step of `model_or_fn` on `example_inputs` (their shapes and
    dtypes: nothing runs) for `topology` over `chips` devices (default 1; more:
    the batch split across them, data parallel with SPMD partitioning).

    mode: "inference" (forward, no_grad) or "training" (forward, loss,
    backward, optimizer step: `optimizer(params)`, default SGD; `loss_fn(outputs,
    inputs)`, default the output's mean, or the output itself when it is a
    scalar loss). With find_largest_batch, the largest batch that fits is
    searched by compiling (first dimension of the inputs). save_dir: the
    serialized executables (loadable by a real TPU of that generation) and
    the scheduled HLO text go there. Returns a Report.
    """
    from . import core as impl
    if mode not in ("inference", "training"):
        raise ValueError(f"torch_pjrt: readiness: mode must be 'inference' or 'training', got {mode!r}")
    if mode == "training" and not isinstance(model_or_fn, torch.nn.Module) and not callable(model_or_fn):
        raise TypeError("torch_pjrt: readiness: training needs an nn.Module (or a function returning one)")
    chips = chips or 1
    batch = impl.batch_of(example_inputs)
    programs, persistent = impl.capture_step(model_or_fn, example_inputs, mode, optimizer, loss_fn)
    report = impl.check_programs(programs, persistent, topology, chips, mode, batch, save_dir)
    if find_largest_batch and batch:
        report.largest_batch = largest_batch(model_or_fn, example_inputs, topology, mode, optimizer, chips, loss_fn,
                                             known=(batch, report.fits), max_batch=max_batch)
    return report


def largest_batch(model_or_fn, example_inputs, topology="v5e:2x2", mode="inference", optimizer=None, chips=1,
                  loss_fn=None, known=None, max_batch=1 << 20):
    """The largest batch (a multiple of `chips`) whose step fits per chip,
    by compiling: doubling until one does not fit, then bisecting; None when
    even `chips` does not fit."""
    from . import core as impl
    base = impl.batch_of(example_inputs)

    def fits(b):
        inputs = impl.with_batch(example_inputs, base, b)
        programs, persistent = impl.capture_step(model_or_fn, inputs, mode, optimizer, loss_fn)
        return impl.check_programs(programs, persistent, topology, chips, mode, b).fits

    cache = {}

    def ok(b):
        if b not in cache:
            cache[b] = fits(b)
        return cache[b]
    if known:
        cache[known[0]] = known[1]
    lo = chips
    if not ok(lo):
        return None
    hi = lo
    while hi * 2 <= max_batch and ok(hi * 2):
        hi *= 2
    if hi * 2 > max_batch:
        return hi
    # hi fits, 2 hi does not: bisect in steps of `chips`.
    bad = hi * 2
    while bad - hi > chips:
        mid = (hi + bad) // 2 // chips * chips
        if mid <= hi:
            break
        if ok(mid):
            hi = mid
        else:
            bad = mid
    return hi


import torch  # noqa: E402  (after the docstring's API, for check()'s type test)
