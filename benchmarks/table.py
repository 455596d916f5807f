"""One results table for the benchmark scripts: markdown (for docs/results.md)
or aligned text. `formats` gives each column's format spec ("", ".2f", ".1e")."""


def print_table(head, rows, formats, markdown=False):
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
