"""Published peak figures per TPU generation, for a roofline step-time
ESTIMATE: time = max(flops / peak FLOP/s, bytes accessed / memory bandwidth),
per program and device. These are vendor peak numbers (bf16 dense matmul,
HBM bandwidth) from Google Cloud's TPU documentation (docs/tpu_readiness.md
cites each); real programs reach a fraction of them, float32 matmuls run
as several bf16 passes, and XLA's own cost model is not a measurement either.
Everything shown from this table is labelled an estimate."""

# generation: (device kinds libtpu reports, peak bf16 FLOP/s per chip,
#              HBM bandwidth bytes/s per chip, HBM bytes per chip)
GENERATIONS = {
    "v2": (("TPU v2",), 45e12, 600e9, 16 * 2**30),
    "v3": (("TPU v3",), 123e12, 900e9, 32 * 2**30),
    "v4": (("TPU v4",), 275e12, 1200e9, 32 * 2**30),
    "v5e": (("TPU v5 lite", "TPU v5e"), 197e12, 819e9, 16 * 2**30),
    "v5p": (("TPU v5", "TPU v5p"), 459e12, 2765e9, 95 * 2**30),
    "v6e": (("TPU v6 lite", "TPU v6e"), 918e12, 1638e9, 32 * 2**30),
    "tpu7x": (("TPU7x", "TPU 7x"), 2307e12, 7380e9, 192 * 2**30),
}


def generation_of(kind):
    """The generation name for a device kind ("TPU v5 lite" -> "v5e"), or None."""
    for name, (kinds, *_rest) in GENERATIONS.items():
        if kind in kinds:
            return name
    return None


def peaks(kind, cores_per_chip=1):
    """(peak FLOP/s, bandwidth bytes/s) per device: a chip's figures shared by
    its cores when libtpu shows each core as a device (v4, tpu7x)."""
    gen = generation_of(kind)
    if gen is None:
        return None
    _, flops, bandwidth, _ = GENERATIONS[gen]
    return flops / cores_per_chip, bandwidth / cores_per_chip


def estimate(flops, bytes_accessed, peak_flops, bandwidth):
    """(seconds, bound) of one program on one device: the roofline."""
    compute = flops / peak_flops if flops else 0.0
    memory = bytes_accessed / bandwidth if bytes_accessed else 0.0
    return max(compute, memory), ("compute" if compute >= memory else "memory")
