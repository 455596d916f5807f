#!/usr/bin/env python
"""OpInfo conformance report: PyTorch's own OpInfo samples on tpu vs CPU.

    python scripts/opinfo_report.py                 # the fast CI subset (tests/test_opinfo.py)
    python scripts/opinfo_report.py --full          # every OpInfo; writes docs/opinfo.md
    python scripts/opinfo_report.py --ops add,mm --dtypes float32,int64
    python scripts/opinfo_report.py --full --md /tmp/x.md --json /tmp/x.json

Prints a per-op table (op, scope, checks, pass, mismatch, error, fallback, pass %) and the
overall pass rate of the checks of in-scope (lowered) ops; the rule deciding which OpInfos
are in scope is printed with it (tests/opinfo_harness.py).  Ops run in a worker process; a
worker that crashes or stalls is restarted after the op it was running, which is recorded
as an error.
"""
import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FULL_DTYPES = "float32,bfloat16,int64,int32,int16,int8,uint8,complex64,complex128,uint16,uint32,uint64"
# Samples per (op, dtype) in a full run: float32 gets the most, each integer dtype fewer.
FULL_CAPS = {"float32": 5, "bfloat16": 3, "int64": 2, "int32": 1, "int16": 1, "int8": 1, "uint8": 1,
             "complex64": 2, "complex128": 1, "uint16": 1, "uint32": 1, "uint64": 1}
FULL_TIME_CAP_S = 12.0      # per op: the samples left after it are not run
STALL_S = 180.0             # a worker without progress this long is killed


# ---- worker ---------------------------------------------------------------------------------------

def worker(args):
    import opinfo_harness as h
    import torch
    names = [n for n in open(args.ops_file).read().split("\n") if n]
    cfg = json.loads(args.config)
    dtypes = [h.DTYPE_NAMES[d] for d in cfg["dtypes"]]
    caps = {h.DTYPE_NAMES[d]: n for d, n in cfg["caps"].items()}
    registry = h.registry_names()
    ops = h.find_ops(names)
    with open(args.records, "a") as out:
        for op in ops:
            out.write(json.dumps({"begin": h.op_key(op)}) + "\n")
            out.flush()
            r = h.run_op(op, dtypes, caps, grads=not cfg["no_grad"], registry=registry,
                         time_cap=cfg["time_cap"])
            rec = {"op": r.op, "scope": r.scope, "note": r.note, "seconds": round(r.seconds, 3),
                   "checks": [[c.dtype, c.sample, c.kind, c.status, c.reason, list(c.fallbacks)]
                              for c in r.checks]}
            out.write(json.dumps({"result": rec}) + "\n")
            out.flush()
            torch_pjrt_clear()
    return 0


def torch_pjrt_clear():
    import torch_pjrt
    try:
        torch_pjrt.clear_executable_cache()
    except Exception:
        pass


# ---- parent: run the workers ------------------------------------------------------------------------

def run_all(names, cfg, direct, verbose=True):
    """Runs the named OpInfos in worker processes; returns {op: result dict}."""
    results = {}
    todo = list(names)
    tmp = tempfile.mkdtemp(prefix="opinfo_")
    records = os.path.join(tmp, "records.jsonl")
    open(records, "w").close()
    consumed = 0
    t_start = time.time()
    while todo:
        ops_file = os.path.join(tmp, "ops.txt")
        with open(ops_file, "w") as f:
            f.write("\n".join(todo) + "\n")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ops-file", ops_file,
               "--records", records, "--config", json.dumps(cfg)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err_tail = collections.deque(maxlen=20)
        import threading

        def drain():
            for line in proc.stderr:
                err_tail.append(line.rstrip())
        threading.Thread(target=drain, daemon=True).start()
        last_size, last_change, current = -1, time.time(), None
        stalled = False
        begun = 0
        while True:
            rc = proc.poll()
            size = os.path.getsize(records)
            if size != last_size:
                last_size, last_change = size, time.time()
                with open(records) as f:
                    f.seek(consumed)
                    chunk = f.read()
                # only whole lines
                whole = chunk[:chunk.rfind("\n") + 1]
                consumed += len(whole)
                for line in whole.splitlines():
                    rec = json.loads(line)
                    if "begin" in rec:
                        current = rec["begin"]
                        begun += 1
                    else:
                        r = rec["result"]
                        results[r["op"]] = r
                        todo.remove(r["op"])
                        current = None
                        if verbose:
                            c = collections.Counter(ch[3] for ch in r["checks"])
                            print(f"  [{len(results):4d}/{len(names)} {time.time() - t_start:6.0f}s] "
                                  f"{r['op']:<42} {r['scope']:<12} "
                                  + " ".join(f"{k}={c[k]}" for k in ("pass", "mismatch", "error", "fallback") if c[k]),
                                  file=sys.stderr, flush=True)
            if rc is not None and size == os.path.getsize(records):
                break
            if rc is None and time.time() - last_change > STALL_S:
                proc.kill()
                proc.wait()
                stalled = True
                break
            time.sleep(0.2)
        proc.wait()
        if not todo:
            break
        if not begun:
            sys.exit("opinfo_report: the worker failed before running any op:\n  "
                     + "\n  ".join(err_tail))
        if current is None:  # died between two ops: just carry on
            continue
        # the worker died (or stalled) while running `current`
        victim = current
        why = (f"no progress for {STALL_S:.0f} s (killed)" if stalled else
               f"worker process died (exit status {proc.returncode})")
        tail = [l for l in err_tail if l.strip()]
        if tail and not stalled:
            why += ": " + tail[-1][:160]
        scope = "direct" if victim in direct else "composite"
        results[victim] = {"op": victim, "scope": scope, "note": why, "seconds": 0,
                           "checks": [["?", 0, "fwd", "error", "Crash: " + why, []]]}
        todo.remove(victim)
        if verbose:
            print(f"  !! {victim}: {why}", file=sys.stderr, flush=True)
    return results


# ---- summarising ---------------------------------------------------------------------------------

STATUSES = ("pass", "mismatch", "error", "fallback")
IN_SCOPE = ("direct", "composite")


def counts(r):
    c = {s: 0 for s in STATUSES}
    for ch in r["checks"]:
        if ch[3] in c:
            c[ch[3]] += 1
    return c


def pct(p, n):
    return f"{100.0 * p / n:.1f}" if n else "-"


def totals(results, scopes):
    t = {s: 0 for s in STATUSES}
    for r in results.values():
        if r["scope"] in scopes:
            for k, v in counts(r).items():
                t[k] += v
    n = sum(t.values())
    return t, n


def failure_class(status, reason):
    """A reason with numbers and tensor shapes folded, to group failures."""
    r = reason
    if status == "fallback":
        m = re.match(r"CPU fallback: ([^(]*)", r)
        return "fallback: " + (m.group(1).strip() if m else r)
    r = re.sub(r"\(\d+/\d+ elements, (torch\.)?(\w+)\)", r"(\2)", r)
    r = re.sub(r"\[\d+\]", "[i]", r)
    r = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", r)
    r = re.sub(r"max abs diff \S+", "values differ", r)
    return f"{status}: {r[:150]}"


def table(results, header=True):
    rows = []
    for name in sorted(results):
        r = results[name]
        if r["scope"] not in IN_SCOPE:
            continue
        c = counts(r)
        n = sum(c.values())
        rows.append((name, r["scope"], n, c["pass"], c["mismatch"], c["error"], c["fallback"],
                     pct(c["pass"], n)))
    return rows


def print_report(results, cfg, rule, wall):
    rows = table(results)
    w = max([len(r[0]) for r in rows] + [10])
    print(f"\n{'op':<{w}}  {'scope':<9} {'checks':>6} {'pass':>5} {'mism':>5} {'err':>5} {'fallb':>5} {'pass%':>6}")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<9} {r[2]:>6} {r[3]:>5} {r[4]:>5} {r[5]:>5} {r[6]:>5} {r[7]:>6}")
    summ = summary_lines(results)
    print()
    for line in summ:
        print(line)
    classes = failure_classes(results)
    if classes:
        print("\nTop failure classes (checks, ops):")
        for cls, (n, ops) in classes[:15]:
            print(f"  {n:5d}  {cls}\n         ops: {', '.join(sorted(ops)[:12])}"
                  + (f" (+{len(ops) - 12})" if len(ops) > 12 else ""))
    print(f"\nRule:\n{rule}\n\nwall time {wall:.0f} s")


def summary_lines(results):
    lines = []
    t, n = totals(results, IN_SCOPE)
    scopes = collections.Counter(r["scope"] for r in results.values())
    lines.append(f"OpInfos: {len(results)} run; direct {scopes['direct']}, composite {scopes['composite']}, "
                 f"not lowered {scopes['not lowered']}, unsupported dtype {scopes['unsupported']}, "
                 f"skipped {scopes['skipped']}")
    lines.append(f"Overall (in-scope ops): {t['pass']}/{n} checks pass = {pct(t['pass'], n)}% "
                 f"(mismatch {t['mismatch']}, error {t['error']}, fallback {t['fallback']})")
    for s in IN_SCOPE:
        ts, ns = totals(results, (s,))
        lines.append(f"  {s:<9}: {ts['pass']}/{ns} = {pct(ts['pass'], ns)}% "
                     f"(mismatch {ts['mismatch']}, error {ts['error']}, fallback {ts['fallback']})")
    fwd = [ch for r in results.values() if r["scope"] in IN_SCOPE for ch in r["checks"] if ch[3] in STATUSES]
    for kind in ("fwd", "grad"):
        k = [ch for ch in fwd if ch[2] == kind]
        p = sum(1 for ch in k if ch[3] == "pass")
        lines.append(f"  {kind:<9}: {p}/{len(k)} = {pct(p, len(k))}%")
    by_dtype = collections.defaultdict(lambda: [0, 0])
    for ch in fwd:
        by_dtype[ch[0]][1] += 1
        by_dtype[ch[0]][0] += ch[3] == "pass"
    lines.append("  by dtype : " + ", ".join(f"{d} {p}/{n} ({pct(p, n)}%)" for d, (p, n) in sorted(by_dtype.items())))
    return lines


def failure_classes(results):
    classes = {}
    for r in results.values():
        if r["scope"] not in IN_SCOPE:
            continue
        for ch in r["checks"]:
            if ch[3] in ("mismatch", "error", "fallback"):
                key = failure_class(ch[3], ch[4])
                n, ops = classes.get(key, (0, set()))
                ops.add(r["op"])
                classes[key] = (n + 1, ops)
    return sorted(classes.items(), key=lambda kv: (-kv[1][0], kv[0]))


def write_markdown(path, results, cfg, rule, wall, argv):
    import torch
    import torch_pjrt
    lines = ["# OpInfo conformance (generated)", "",
             f"Generated by `python scripts/opinfo_report.py {' '.join(argv)}` on "
             f"{datetime.date.today().isoformat()}: PyTorch's OpInfo samples "
             "(`torch.testing._internal.common_methods_invocations.op_db`) run on `tpu` and on CPU "
             "and compared (tests/opinfo_harness.py). Regenerate after adding lowerings; "
             "the fast CI subset is `tests/test_opinfo.py`.", "",
             f"- torch {torch.__version__}, plugin `{torch_pjrt.plugin_info().get('name', '?')}`, "
             f"{len(torch_pjrt.supported_ops())} lowerings registered",
             f"- dtypes: {', '.join(cfg['dtypes'])}; samples per op and dtype: "
             + ", ".join(f"{d} {n}" for d, n in cfg["caps"].items())
             + f"; gradients: {'no' if cfg['no_grad'] else 'yes (float dtypes the op differentiates)'}"
             f"; time cap {cfg['time_cap']:.0f} s per op; wall time {wall:.0f} s",
             "- tolerances: tests/conftest.py `TOLERANCES` per dtype (integers exact), loosened to an "
             "OpInfo's own `toleranceOverride` for `TestCommon.test_compare_cpu`; `equal_nan=True`; "
             "dtypes and shapes must match.", "",
             "## Rule", "", "```", rule, "```", "",
             "## Summary", ""]
    lines += [f"- {l.strip()}" for l in summary_lines(results)]
    lines += ["", "## Failure classes", "",
              "Failing checks of in-scope ops, grouped by reason (numbers folded).", "",
              "| checks | class | ops |", "|---:|---|---|"]
    for cls, (n, ops) in failure_classes(results):
        lines.append(f"| {n} | {_md(cls)} | {_md(', '.join(sorted(ops)))} |")
    lines += ["", "## Per-op table (in-scope ops)", "",
              "| op | scope | checks | pass | mismatch | error | fallback | pass % |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in table(results):
        lines.append("| " + " | ".join(_md(str(x)) for x in r) + " |")
    lines += ["", "## Failing samples", "",
              "Per op: dtype, sample index (in `op.sample_inputs`), check, status, reason.", ""]
    for name in sorted(results):
        r = results[name]
        if r["scope"] not in IN_SCOPE:
            continue
        bad = [ch for ch in r["checks"] if ch[3] in ("mismatch", "error", "fallback")]
        if not bad:
            continue
        lines.append(f"- **{name}** ({len(bad)} failing)")
        groups = collections.OrderedDict()
        for ch in bad:
            groups.setdefault((ch[3], ch[4]), []).append(f"{ch[0]}#{ch[1]} {ch[2]}")
        for (status, reason), where in groups.items():
            shown = ", ".join(where[:8]) + (f", +{len(where) - 8}" if len(where) > 8 else "")
            lines.append(f"  - {status}: {_md(reason)} — {shown}")
    notl = collections.defaultdict(list)
    for name in sorted(results):
        r = results[name]
        if r["scope"] == "not lowered":
            fb = r["checks"][-1][5] if r["checks"] else []
            for f in fb or ["?"]:
                notl[f].append(name)
    lines += ["", "## Not lowered (out of scope)", "",
              "OpInfos whose probe sample needed a CPU fallback, by the ATen op that fell back "
              "(most OpInfos first): the lowerings that would bring them in.", "",
              "| fallback op | OpInfos |", "|---|---|"]
    for f, ops in sorted(notl.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| {_md(f)} ({len(ops)}) | {_md(', '.join(ops))} |")
    lines += ["", "## Unsupported dtypes (out of scope)", ""]
    uns = [f"{n} ({results[n]['note'].split(': ', 1)[-1]})" for n in sorted(results)
           if results[n]["scope"] == "unsupported"]
    lines.append(_md(", ".join(uns)) if uns else "none")
    skipped = collections.defaultdict(list)
    for name in sorted(results):
        r = results[name]
        if r["scope"] == "skipped":
            skipped[r["note"] or "skipped"].append(name)
    lines += ["", "## Skipped", "", "| reason | OpInfos |", "|---|---|"]
    for why, ops in sorted(skipped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| {_md(why)} | {_md(', '.join(ops))} |")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _md(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


# ---- main ------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="every OpInfo in op_db, all dtypes; writes docs/opinfo.md")
    ap.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    ap.add_argument("--dtypes", help=f"comma-separated dtypes (full run: {FULL_DTYPES})")
    ap.add_argument("--max-samples", type=int, help="samples per op and dtype (overrides the defaults)")
    ap.add_argument("--no-grad", action="store_true", help="forward checks only")
    ap.add_argument("--md", help="write the markdown report here (default for --full: docs/opinfo.md)")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ops-file", help=argparse.SUPPRESS)
    ap.add_argument("--records", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import opinfo_harness as h
    import test_opinfo
    t0 = time.time()
    registry = h.registry_names()
    if args.ops:
        names = [n.strip() for n in args.ops.split(",") if n.strip()]
        h.find_ops(names)
    elif args.full:
        names = [h.op_key(op) for op in h.load_op_db()]
        names = list(dict.fromkeys(names))
    else:
        names = list(test_opinfo.SUBSET)
    if args.dtypes:
        dtypes = [d.strip() for d in args.dtypes.split(",")]
    elif args.full or args.ops:
        dtypes = FULL_DTYPES.split(",")
    else:
        dtypes = [str(d).replace("torch.", "") for d in test_opinfo.DTYPES]
    for d in dtypes:
        if d not in h.DTYPE_NAMES:
            ap.error(f"unknown dtype {d}")
    if args.max_samples:
        caps = {d: args.max_samples for d in dtypes}
    elif args.full or args.ops:
        caps = {d: FULL_CAPS.get(d, 2) for d in dtypes}
    else:
        caps = {d: test_opinfo.MAX_SAMPLES for d in dtypes}
    cfg = {"dtypes": dtypes, "caps": caps, "no_grad": args.no_grad,
           "time_cap": FULL_TIME_CAP_S}
    direct = {h.op_key(op) for op in h.find_ops(names) if h.is_direct(op, registry)}
    print(f"running {len(names)} OpInfos ({len(direct)} direct), dtypes {', '.join(dtypes)}",
          file=sys.stderr, flush=True)
    results = run_all(names, cfg, direct, verbose=not args.quiet)
    wall = time.time() - t0
    print_report(results, cfg, h.RULE, wall)
    md = args.md or ("docs/opinfo.md" if args.full else None)
    if md:
        path = md if os.path.isabs(md) else os.path.join(ROOT, md)
        write_markdown(path, results, cfg, h.RULE, wall, sys.argv[1:])
        print(f"wrote {path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
