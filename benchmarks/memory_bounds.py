"""Host memory held by the two things the reliability work bounds, each
setting in its own fresh process:

1. the in-memory executable cache: resident memory after 200 and after 1,000
   distinct eager shapes (x * 2 + 1 on a new shape: two new programs each),
   with the default bound, a small one and none;
2. the asynchronous queue: a producer launching 40 ops far ahead of the
   device, each with a 64 MiB result that dies at once (the issue's case):
   peak resident memory and max_memory_allocated(), with the default queue
   bound, a small one, an effectively unbounded queue, and a 512 MiB memory
   limit.

    python benchmarks/memory_bounds.py [--markdown]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES = r"""
import json, os, torch, torch_pjrt
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
marks = {}
for n in range(1, 1001):
    (torch.ones(n, 3).to("tpu") * 2 + 1).cpu()
    if n in (200, 1000):
        marks[n] = rss_mib()
m = torch_pjrt.metrics()
print("RESULT " + json.dumps({"rss200": marks[200], "rss1000": marks[1000], "size": m["executable_cache_size"],
                              "evictions": m["executable_cache_evictions"]}))
"""

QUEUE = r"""
import json, torch, torch_pjrt
x = torch.ones(16 << 20).to("tpu")
torch.tpu.synchronize()
torch.tpu.reset_peak_memory_stats()
for i in range(40):
    y = x * float(i)
    del y
torch.tpu.synchronize()
m = torch_pjrt.metrics()
# VmHWM, not ru_maxrss: the latter starts from the forking parent's peak.
peak_rss = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) / 1024
print("RESULT " + json.dumps({"peak_rss": peak_rss,
                              "max_alloc": torch.tpu.max_memory_allocated() / 2**20,
                              "waits": m["queue_full_waits"], "drains": m["memory_drains"]}))
"""


def run(code, **env):
    full = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TORCH_PJRT_CACHE_DIR="")
    full.update({k: str(v) for k, v in env.items()})
    p = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])


def table(head, rows, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        for r in [head] + rows:
            print("  ".join(f"{str(c):>24}" for c in r))
    print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = []
    for label, entries in (("default (4096 entries)", None), ("64 entries", 64), ("no bound", 0)):
        env = {} if entries is None else {"TORCH_PJRT_EXECUTABLE_CACHE_ENTRIES": entries}
        r = run(SHAPES, **env)
        rows.append([label, f"{r['rss200']:.0f}", f"{r['rss1000']:.0f}", f"{r['rss1000'] - r['rss200']:+.0f}",
                     r["size"], r["evictions"]])
    table(["executable cache bound", "RSS after 200 shapes (MiB)", "after 1,000 (MiB)", "growth (MiB)",
           "programs cached", "evictions"], rows, args.markdown)
    rows = []
    for label, env in (("default (64 in flight)", {}), ("4 in flight", {"TORCH_PJRT_MAX_INFLIGHT": 4}),
                       ("1,000 in flight", {"TORCH_PJRT_MAX_INFLIGHT": 1000}),
                       ("64 in flight, 512 MiB limit", {"TORCH_PJRT_MEMORY_LIMIT": "512MiB"})):
        r = run(QUEUE, **env)
        rows.append([label, f"{r['peak_rss']:.0f}", f"{r['max_alloc']:.0f}", r["waits"], r["drains"]])
    table(["queue", "peak RSS (MiB)", "max_memory_allocated (MiB)", "queue-full waits", "memory drains"], rows,
          args.markdown)


if __name__ == "__main__":
    main()
