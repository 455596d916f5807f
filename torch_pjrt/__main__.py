"""`python -m torch_pjrt assess ...` (the migration assessment),
`python -m torch_pjrt readiness ...` (TPU readiness without a TPU) and
`python -m torch_pjrt cache ...` (the persistent executable cache)."""
import argparse
import os
import sys


def _assess(argv):
    p = argparse.ArgumentParser(
        prog="python -m torch_pjrt assess",
        description="Assess moving a PyTorch model to an XLA device (tpu): op coverage, numerics against a "
                    "baseline, cold start, latency and throughput per batch size, memory, failures by class, "
                    "cost per 1,000 items and a verdict, in DIR/report.{json,md,html}.")
    p.add_argument("workload", nargs="?", help="path/to/file.py:function or module:function returning a "
                                               "torch_pjrt.assess.Workload")
    p.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory instead of WORKLOAD")
    p.add_argument("--out", required=True, metavar="DIR", help="where the report goes")
    p.add_argument("--config", metavar="FILE.toml", help="prices, thresholds and settings (defaults are in the "
                                                         "report)")
    p.add_argument("--quick", action="store_true", help="fewer iterations and a shorter memory sweep")
    p.add_argument("--baseline-only", action="store_true",
                   help="only capture the baseline side (outputs, timings) on --device, for --against elsewhere")
    p.add_argument("--device", default=None, help="the baseline device (default: cuda where present, else cpu)")
    p.add_argument("--against", metavar="BASELINE.json",
                   help="compare with a baseline captured by --baseline-only (e.g. on the GPU deployment)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if bool(args.workload) == bool(args.hf):
        p.error("give either WORKLOAD or --hf DIR")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out}: exists and is not a directory (the report is written into a directory)")
    spec = f"hf:{args.hf}" if args.hf else args.workload
    if args.no_progress:  # (transformers' and the Hub's bars too, here and in the workers)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from torch_pjrt.assess import runner
    overrides = {"run": {"baseline_device": args.device}} if args.device else None
    try:
        if args.baseline_only:
            path = runner.capture_baseline(spec, args.out, args.device or "auto", args.config, args.quick, overrides,
                                           not args.no_progress)
            print(f"baseline captured: {path}")
            return 0
        report = runner.Assessment(spec, args.out, args.config, args.quick, overrides, args.against,
                                   not args.no_progress).run()
    except (ValueError, FileNotFoundError, AttributeError, TypeError, ImportError, SyntaxError) as e:
        print(f"torch_pjrt assess: {e}", file=sys.stderr)  # the workload or the settings
        return 2
    except Exception as e:  # noqa: BLE001
        if os.environ.get("TORCH_PJRT_ASSESS_DEBUG"):
            raise
        print(f"torch_pjrt assess: {type(e).__name__}: {e} (TORCH_PJRT_ASSESS_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1
    v = report.get("verdict") or {}
    print(f"verdict: {v.get('overall', 'not decided')}")
    for b in (v.get("blocking") or [])[:5]:
        print(f"  blocking: {b}")
    if v.get("not_measured"):  # (a partial run's verdict does not cover these)
        print(f"  not measured: {', '.join(v['not_measured'])}")
    out = os.path.abspath(args.out)
    print(f"report: {os.path.join(out, 'report.html')} (also report.md, report.json)")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m torch_pjrt {assess,readiness,cache} ...\n"
              "  assess     assess moving a PyTorch model to an XLA device (python -m torch_pjrt assess -h)\n"
              "  readiness  compile a workload for TPU topologies, no TPU needed (python -m torch_pjrt readiness -h)\n"
              "  cache      the persistent executable cache (python -m torch_pjrt cache -h)",
              file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2  # (no command is a usage error, as argparse's)
    command, rest = argv[0], argv[1:]
    if command == "assess":
        return _assess(rest)
    if command == "readiness":
        from torch_pjrt.readiness import cli
        return cli.main(rest)
    if command == "cache":
        from torch_pjrt import cache
        return cache.main(rest)
    print(f"python -m torch_pjrt: unknown command {command!r} (assess, readiness, cache)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
