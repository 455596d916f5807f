"""Random factories and `*_like` random ops in compiled graphs, written with
the random ops the registry lowers (`uniform`, `normal`, `random` of a new
tensor). PyTorch has no decomposition of them (Inductor lowers them itself),
so without these a graph with `torch.randn_like` (diffusion noise, a VAE's
reparameterization) ran in pieces. Eager makes them the same way (empty, then
uniform_ / normal_ / random_), so a compiled graph draws what eager draws.
An explicit generator keeps the op as it is (it runs between pieces)."""
import torch

aten = torch.ops.aten


def _new(size, dtype, device, default):
    return torch.empty(size, dtype=dtype if dtype is not None else default, device=device)


def _like(x, dtype, device):
    return torch.empty(x.shape, dtype=dtype if dtype is not None else x.dtype,
                       device=device if device is not None else x.device)


def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.uniform(_new(size, dtype, device, torch.get_default_dtype()), 0.0, 1.0)


def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.normal_functional(_new(size, dtype, device, torch.get_default_dtype()), 0.0, 1.0)


def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.uniform(_like(x, dtype, device), 0.0, 1.0)


def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return aten.normal_functional(_like(x, dtype, device), 0.0, 1.0)


# (random.to and an add, not random.from: FX writes an op that is an argument
# of another, checkpointing's run_and_save_rng_state, as code, and `from` is
# a Python keyword.)
def _randint(t, low, high):
    if low == 0:
        return aten.random.to(t, high)
    span = high - low
    if t.dtype.is_floating_point or t.dtype == torch.bool or span <= torch.iinfo(t.dtype).max:
        return aten.random.to(t, span) + low
    # The span does not fit t's dtype (randint(-100, 100, dtype=torch.int8)):
    # drawn in int64, where adding low lands in t's range. (Bounds made
    # concrete: a symbolic span minus 2**64 is no int64 for the graph.)
    low, high = int(low), int(high)
    span = high - low
    wide = torch.empty(t.shape, dtype=torch.int64, device=t.device)
    if span <= 2**63 - 1:
        return (aten.random.to(wide, span) + low).to(t.dtype)
    # A span in [2^63, 2^64) (randint(-2**62, 2**62)): 64 random bits modulo
    # the span, as CPU's random64() % range, compared as unsigned and wrapping.
    bits = (aten.random.to(wide, 2**32) << 32) | aten.random.to(torch.empty_like(wide), 2**32)
    s = span - 2**64  # the span's bits as an int64
    over = (bits ^ -2**63) >= (s ^ -2**63)
    return torch.where(over, bits - s, bits) + low


def randint(high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(_new(size, dtype, device, torch.int64), 0, high)


def randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(_new(size, dtype, device, torch.int64), low, high)


def randint_like(x, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint(_like(x, dtype, device), 0, high)


def randint_like_low(x, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint(_like(x, dtype, device), low, high)


def normal_functional(x, mean=0.0, std=1.0, *, generator=None):
    if generator is not None:
        return NotImplemented
    # normal.Tensor_float of a zero mean draws exactly what normal_ draws (one key,
    # the same standard normals), scaled and shifted as normal_ does.
    return aten.normal.Tensor_float(torch.full_like(x, mean), std)


TABLE = {
    aten.rand.default: rand,
    aten.randn.default: randn,
    aten.rand_like.default: rand_like,
    aten.randn_like.default: randn_like,
    aten.randint.default: randint,
    aten.randint.low: randint_low,
    aten.randint_like.default: randint_like,
    aten.randint_like.low_dtype: randint_like_low,
    aten.normal_functional.default: normal_functional,
}
