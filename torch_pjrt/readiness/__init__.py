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
from .. import _state


def check(model_or_fn, example_inputs, topology="v5e:2x2", mode="inference", optimizer=None, chips=None,
          loss_fn=None, find_largest_batch=False, save_dir=None, max_batch=1 << 20, tolerance=0.0):
    """Compiles one step of `model_or_fn` on `example_inputs` (their shapes and
    dtypes: nothing runs) for `topology` over `chips` devices (default 1; more:
    the batch split across them, data parallel with SPMD partitioning).

    mode: "inference" (forward, no_grad) or "training" (forward, loss,
    backward, optimizer step: `optimizer(params)` (a class like
    torch.optim.AdamW, a function, or an optimizer whose type and settings
    are reused), default SGD; `loss_fn(outputs,
    inputs)`, default the output's mean, or the output itself when it is a
    scalar loss). With find_largest_batch, the largest batch that fits is
    searched by compiling (first dimension of the inputs; exact to a
    multiple of `chips`, or stopped once the smallest batch found too big is
    within `tolerance` (a fraction) of it: big programs compile slowly). save_dir: the
    serialized executables (loadable by a real TPU of that generation) and
    the scheduled HLO text go there. Returns a Report.
    """
    from . import core as impl
    if mode not in ("inference", "training"):
        raise ValueError(f"torch_pjrt: readiness: mode must be 'inference' or 'training', got {mode!r}")
    chips = 1 if chips is None else chips
    impl.validate_args(model_or_fn, topology, chips, max_batch, tolerance)
    optimizer = impl.optimizer_factory(optimizer)
    batch = impl.batch_of(example_inputs)
    programs, persistent = impl.capture_step(model_or_fn, example_inputs, mode, optimizer, loss_fn)
    report = impl.check_programs(programs, persistent, topology, chips, mode, batch, save_dir)
    if find_largest_batch and batch:
        report.largest_batch, report.smallest_not_fitting = search(
            model_or_fn, example_inputs, topology, mode, optimizer, chips, loss_fn,
            known=(batch, report.step_peak_bytes), max_batch=max_batch, tolerance=tolerance)
    return report


def largest_batch(model_or_fn, example_inputs, topology="v5e:2x2", mode="inference", optimizer=None, chips=1,
                  loss_fn=None, max_batch=1 << 20, tolerance=0.0):
    """The largest batch (a multiple of `chips`) whose step fits per chip,
    found by compiling; None when even `chips` does not fit."""
    return search(model_or_fn, example_inputs, topology, mode, optimizer, chips, loss_fn, max_batch=max_batch,
                  tolerance=tolerance)[0]


def search(model_or_fn, example_inputs, topology="v5e:2x2", mode="inference", optimizer=None, chips=1,
           loss_fn=None, known=None, max_batch=1 << 20, captures=None, tolerance=0.0):
    """(largest batch that fits or None, smallest batch compiled and found
    too big or None).

    Peak memory is close to linear in the batch, so each next batch tried is
    the one the last two compiled peaks predict, inside the bracket of a
    batch that fits and one that does not (bisection when the prediction
    falls outside); a handful of compiles instead of a doubling walk.
    `captures`: a dict shared between calls (batch -> captured step), so
    several topologies trace each batch once."""
    from . import core as impl
    impl.validate_args(model_or_fn, topology, chips, max_batch, tolerance)
    base = impl.batch_of(example_inputs)
    captures = {} if captures is None else captures

    def peak(b):
        if b not in captures:
            captures[b] = impl.capture_step(model_or_fn, impl.with_batch(example_inputs, base, b), mode,
                                            optimizer, loss_fn)
        return impl.check_programs(*captures[b], topology, chips, mode, b, keep_hlo=False).step_peak_bytes
    memory = impl.chip_memory(topology)
    return impl.search_largest(peak, chips, max_batch, memory, known, tolerance=tolerance)


def eager_programs(fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` eagerly on tpu and returns the op programs
    it compiled, as captured programs for check_eager(). The executable cache
    is cleared first, so that every op's program is built (and seen) again."""
    from .._compile.capture import Program
    C = _state.C
    C.clear_executable_cache()
    was = C.record_programs(True)
    try:
        fn(*args, **kwargs)
        torch.tpu.synchronize()
    finally:
        C.record_programs(was)
    out = []
    for i, (op, text) in enumerate(C.take_recorded_programs()):
        out.append(Program(f"{i}:{op}", "eager", text, [], [], []))
    return out


def check_eager(fn, *args, topology="v5e:2x2", **kwargs):
    """The eager op programs `fn` runs, each compiled for `topology` (one
    chip): a Report whose programs are the ops, step figures their sums and
    largest peak."""
    from . import core as impl
    return impl.check_programs(eager_programs(fn, *args, **kwargs), {}, topology, 1, "eager", None)


import torch  # noqa: E402  (after the docstring's API; eager_programs uses it)
