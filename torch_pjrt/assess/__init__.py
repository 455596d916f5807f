"""The migration assessment: `python -m torch_pjrt assess WORKLOAD --out DIR`.

Before a team pays for TPU time it learns here whether its PyTorch model
runs on an XLA device, whether the numbers match, what cold start, warm
latency and throughput per batch size are, whether it fits, what fails and
why, and what a completed task costs, with a verdict. WORKLOAD names a
function returning a `Workload` (workload.py); the stages are in runner.py,
each in its own process; the report (report.json, report.md, report.html)
follows schema.md.
"""
from .workload import Workload, load, load_spec  # noqa: F401


def assess(spec, out_dir, config=None, quick=False, overrides=None, against=None, progress=True):
    """Runs the assessment of `spec` ("file.py:function", "module:function"
    or "hf:DIR"); returns the report dict (also written to out_dir)."""
    from .runner import Assessment
    return Assessment(spec, out_dir, config, quick, overrides, against, progress).run()
