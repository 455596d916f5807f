"""Pieces the device-vs-CPU benchmark scripts share: their command line, the
timing (the first tpu call apart, then warm calls alternating with CPU's,
medians) and the results table (markdown for docs/results.md, or aligned text)."""
import argparse
import statistics
import time


def parse_args(doc, repeats=10, extra=()):
    """--repeats and --markdown, plus (flag, kwargs) pairs in `extra`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--markdown", action="store_true")
    for flag, kwargs in extra:
        p.add_argument(flag, **kwargs)
    return p.parse_args()


def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(on_tpu, on_cpu, repeats):
    """(first tpu call, tpu median, cpu median) in ms; each call must sync itself."""
    first = seconds(on_tpu)
    dev, cpu = [], []
    for _ in range(repeats):  # alternating, so both see the same machine
        cpu.append(seconds(on_cpu))
        dev.append(seconds(on_tpu))
    return first * 1e3, statistics.median(dev) * 1e3, statistics.median(cpu) * 1e3


def print_table(head, rows, formats, markdown=False):
    """`formats`: each column's format spec ("", ".2f", ".1e")."""
    cells = [[format(v, f) for v, f in zip(r, formats)] for r in rows]
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for c in cells:
            print("| " + " | ".join(c) + " |")
        return
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))
