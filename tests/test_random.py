"""Random ops on tpu: results stay on tpu with the requested dtype and shape,
follow the distribution (checked on 10^5 samples), and are reproducible from
the generator's seed."""
import math

import pytest
import torch

import torch_pjrt  # noqa: F401
from conftest import check_raises, tpu

N = 100_000
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def on_tpu(t, dtype, shape):
    assert t.device.type == "tpu"
    assert t.dtype == dtype
    assert tuple(t.shape) == tuple(shape)
    return t.cpu()


def moments(x):
    x = x.double()
    return x.mean().item(), x.std().item()


# ---- uniform ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_rand(dtype):
    x = on_tpu(torch.rand(N, device="tpu", dtype=dtype), dtype, (N,))
    assert x.min() >= 0 and x.max() < 1
    mean, std = moments(x)
    assert abs(mean - 0.5) < 0.01 and abs(std - math.sqrt(1 / 12)) < 0.01
    # Every bin of a histogram gets its share (catches stuck or correlated bits).
    counts = torch.histc(x.float(), bins=10, min=0, max=1)
    assert (counts - N / 10).abs().max() < 0.05 * N / 10 + (0.3 * N / 10 if dtype == torch.bfloat16 else 0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("lo,hi", [(-2.0, 3.0), (10.0, 10.5), (-1e-3, 0.0)])
def test_uniform_(dtype, lo, hi):
    x = on_tpu(torch.empty(N, device="tpu", dtype=dtype).uniform_(lo, hi), dtype, (N,))
    assert x.min() >= lo and x.max() < hi
    # Narrow dtypes quantize the interval (bfloat16 has 8 values in [10, 10.5)):
    # the moments are compared with CPU's draw of the same dtype.
    ref = torch.empty(N, dtype=dtype).uniform_(lo, hi)
    (mean, std), (rmean, rstd) = moments(x), moments(ref)
    width = hi - lo
    assert abs(mean - rmean) < 0.01 * width and abs(std - rstd) < 0.01 * width
    assert abs(mean - (lo + hi) / 2) < 0.1 * width


def test_uniform_shapes_and_views():
    on_tpu(torch.rand(2, 3, 4, device="tpu"), torch.float32, (2, 3, 4))
    on_tpu(torch.rand((), device="tpu"), torch.float32, ())
    on_tpu(torch.rand(0, 3, device="tpu"), torch.float32, (0, 3))
    base = tpu(torch.zeros(4, 6))
    base[:, ::2].uniform_(5, 6)  # a strided view: only its elements change
    b = base.cpu()
    assert (b[:, 1::2] == 0).all() and (b[:, ::2] >= 5).all() and (b[:, ::2] < 6).all()


def test_uniform_error():
    with pytest.raises(RuntimeError):
        torch.empty(3).uniform_(2, 1)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu").uniform_(2, 1)


# ---- normal -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
def test_randn(dtype):
    x = on_tpu(torch.randn(N, device="tpu", dtype=dtype), dtype, (N,))
    mean, std = moments(x)
    assert abs(mean) < 0.02 and abs(std - 1) < 0.02
    assert torch.isfinite(x).all()
    # Tails of a normal distribution: P(|z| > 2) = 0.0455.
    frac = (x.double().abs() > 2).double().mean().item()
    assert abs(frac - 0.0455) < 0.005
    # P(|z| > 3.5) = 4.7e-4: about 47 of 10^5 (none if the uniforms are too coarse).
    assert 15 < (x.double().abs() > 3.5).sum().item() < 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_(dtype):
    x = on_tpu(torch.empty(N, device="tpu", dtype=dtype).normal_(3.0, 0.5), dtype, (N,))
    mean, std = moments(x)
    assert abs(mean - 3) < 0.01 and abs(std - 0.5) < 0.01


def test_torch_normal_overloads():
    x = on_tpu(torch.normal(2.0, 3.0, (N,), device="tpu"), torch.float32, (N,))
    mean, std = moments(x)
    assert abs(mean - 2) < 0.06 and abs(std - 3) < 0.06
    means = tpu(torch.arange(4.0).repeat(N // 4))
    stds = tpu(torch.tensor([0.1, 1.0, 2.0, 0.5]).repeat(N // 4))
    m = N // 4  # samples per column; bounds are 6 standard errors
    for y, s in [(torch.normal(means, 0.25), torch.full((4,), 0.25)),
                 (torch.normal(means, stds), torch.tensor([0.1, 1.0, 2.0, 0.5]))]:
        y = on_tpu(y, torch.float32, (N,)).view(-1, 4)
        assert ((y.mean(0) - torch.arange(4.0)).abs() < 6 * s / m**0.5).all()
        assert ((y.std(0) - s).abs() < 6 * s / (2 * m)**0.5).all()
    z = on_tpu(torch.normal(1.0, stds), torch.float32, (N,)).view(-1, 4)
    assert ((z.mean(0) - 1).abs() < 6 * stds.cpu()[:4] / m**0.5).all()


def test_normal_error():
    with pytest.raises(RuntimeError):
        torch.empty(3).normal_(0, -1)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu").normal_(0, -1)


# ---- bernoulli ----------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_bernoulli_float_p(p, dtype):
    x = on_tpu(torch.empty(N, device="tpu", dtype=dtype).bernoulli_(p), dtype, (N,))
    assert ((x == 0) | (x == 1)).all()
    assert abs(x.double().mean().item() - p) < 0.01


def test_bernoulli_tensor_p():
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]).repeat(N // 5)
    for y in (torch.bernoulli(tpu(p)), tpu(torch.zeros(N)).bernoulli_(tpu(p)),
              torch.bernoulli(tpu(p.double())), torch.empty(N, device="tpu").bernoulli_(tpu(p.half()))):
        assert y.device.type == "tpu" and y.shape == (N,)
        freq = y.cpu().double().view(-1, 5).mean(0)
        assert (freq - torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)).abs().max() < 0.02
    assert torch.bernoulli(tpu(p.double())).dtype == torch.float64
    y = on_tpu(torch.bernoulli(tpu(torch.zeros(N)), p=0.25), torch.float32, (N,))
    assert abs(y.mean().item() - 0.25) < 0.01


# ---- random_ / randint --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                   torch.float32, torch.float64])
@pytest.mark.parametrize("lo,hi", [(0, 10), (-5, 7), (3, 4), (0, 100)])
def test_randint(dtype, lo, hi):
    if dtype == torch.uint8 and lo < 0:
        pytest.skip("negative bound for uint8")
    x = on_tpu(torch.randint(lo, hi, (N,), device="tpu", dtype=dtype), dtype, (N,))
    assert x.min() == lo and x.max() == hi - 1
    assert (x == x.round()).all()
    counts = torch.bincount((x.long() - lo), minlength=hi - lo).double()
    expected = N / (hi - lo)
    assert ((counts - expected).abs() / expected**0.5).max() < 6  # 6 sigma per bin


def test_randint_large_and_default_dtype():
    x = on_tpu(torch.randint(2**40, (N,), device="tpu"), torch.int64, (N,))
    assert x.min() >= 0 and x.max() < 2**40 and x.double().mean() > 0.45 * 2**40
    x = on_tpu(torch.randint(-2**62, 2**62, (N,), device="tpu"), torch.int64, (N,))
    assert (x < 0).double().mean().item() == pytest.approx(0.5, abs=0.01)
    on_tpu(torch.randint(5, (2, 3), device="tpu"), torch.int64, (2, 3))
    on_tpu(torch.randint_like(tpu(torch.zeros(3, 2)), 7), torch.float32, (3, 2))


@pytest.mark.parametrize("dtype,top", [(torch.int64, 2**63 - 1), (torch.int32, 2**31 - 1),
                                       (torch.uint8, 255), (torch.float32, 2**24),
                                       (torch.float64, 2**53), (torch.float16, 2**11),
                                       (torch.bool, 1)])
def test_random_default_range(dtype, top):
    x = on_tpu(torch.empty(N, device="tpu", dtype=dtype).random_(), dtype, (N,))
    xd = x.double()
    assert xd.min() >= 0 and xd.max() <= top
    assert abs(xd.mean().item() / top - 0.5) < 0.02


def test_random_to_and_from():
    x = on_tpu(torch.empty(N, device="tpu", dtype=torch.int64).random_(6), torch.int64, (N,))
    assert x.min() == 0 and x.max() == 5
    x = on_tpu(torch.empty(N, device="tpu", dtype=torch.int16).random_(-3, 3), torch.int16, (N,))
    assert x.min() == -3 and x.max() == 2
    x = on_tpu(torch.empty(N, device="tpu", dtype=torch.int8).random_(100, None), torch.int8, (N,))
    assert x.min() == 100 and x.max() == 127
    x = on_tpu(torch.empty(N, device="tpu", dtype=torch.int64).random_(-2**63, None), torch.int64, (N,))
    assert (x < 0).double().mean().item() == pytest.approx(0.5, abs=0.01)
    # A range wider than 2^63 but not the full 2^64; 64-bit words mod range, as on
    # CPU, make the lowest 2^62 values twice as likely: half are negative.
    x = on_tpu(torch.empty(N, device="tpu", dtype=torch.int64).random_(-2**62, None), torch.int64, (N,))
    assert x.min() >= -2**62 and (x < 0).double().mean().item() == pytest.approx(0.5, abs=0.01)


def test_random_error():
    with pytest.raises(RuntimeError):
        torch.empty(3, dtype=torch.int64).random_(5, 2)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="tpu", dtype=torch.int64).random_(5, 2)


# ---- seeding ------------------------------------------------------------------------------

def draw():
    return [torch.rand(5, device="tpu").cpu(), torch.randn(5, device="tpu").cpu(),
            torch.randint(0, 1000, (5,), device="tpu").cpu()]


def test_torch_manual_seed_reproduces():
    torch.manual_seed(1234)
    a = draw()
    torch.manual_seed(1234)
    b = draw()
    torch.manual_seed(4321)
    c = draw()
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y)
        assert not torch.equal(x, z)


def test_tpu_manual_seed_reproduces():
    torch.tpu.manual_seed(7)
    a = draw()
    torch.tpu.manual_seed(7)
    b = draw()
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_explicit_generator():
    g1 = torch.Generator(device="tpu").manual_seed(99)
    g2 = torch.Generator(device="tpu").manual_seed(99)
    g3 = torch.Generator(device="tpu").manual_seed(100)
    a = torch.rand(8, device="tpu", generator=g1).cpu()
    b = torch.rand(8, device="tpu", generator=g2).cpu()
    c = torch.rand(8, device="tpu", generator=g3).cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)
    # The generator advances: the next draw differs from the first.
    assert not torch.equal(torch.rand(8, device="tpu", generator=g1).cpu(), a)
    n1 = torch.empty(8, device="tpu").normal_(generator=g1).cpu()
    n2 = torch.empty(8, device="tpu").normal_(generator=g2).cpu()
    assert not torch.equal(n1, n2)  # g1 drew one extra time


def test_successive_draws_differ_and_no_recompile(metrics_delta):
    torch.rand(1000, device="tpu")
    before = metrics_delta()["xla_compiles"]
    a, b = torch.rand(1000, device="tpu").cpu(), torch.rand(1000, device="tpu").cpu()
    assert not torch.equal(a, b)
    assert (a == b).double().mean() < 0.01
    assert metrics_delta()["xla_compiles"] == before  # the key is an input, not a constant


def test_state_roundtrip():
    gen = torch.Generator(device="tpu").manual_seed(5)
    state = gen.get_state()
    a = torch.rand(6, device="tpu", generator=gen).cpu()
    gen.set_state(state)
    b = torch.rand(6, device="tpu", generator=gen).cpu()
    assert torch.equal(a, b)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_multinomial_frequencies(replacement, dtype, no_cpu_fallback):
    # First draws follow p / sum(p) (with or without replacement), over 4 rows x 4000 calls' worth.
    p = torch.tensor([0.1, 0.0, 0.5, 0.4, 2.0], dtype=dtype)
    probs = tpu(p.repeat(4000, 1))
    torch.manual_seed(0)
    s = torch.multinomial(probs, 2, replacement=replacement)
    assert s.dtype == torch.int64 and s.shape == (4000, 2) and s.device.type == "tpu"
    first = torch.bincount(s[:, 0].cpu(), minlength=5).double() / 4000
    expected = p.double() / p.double().sum()
    assert first[1] == 0  # a zero probability is never drawn
    assert torch.allclose(first, expected, atol=0.03), (first, expected)
    if not replacement:
        assert (s[:, 0] != s[:, 1]).all()
        # The second draw is proportional to what is left: P(2nd = 2 | 1st = 4) = 0.5 / 1.0.
        sc = s.cpu()
        after4 = sc[sc[:, 0] == 4, 1]
        assert abs((after4 == 2).double().mean().item() - 0.5) < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multinomial_many_samples_with_replacement(dtype, no_cpu_fallback):
    """From k > bit_width(categories) on, samples come from the rows' running sums
    (k * categories exponential clocks took 1.6 GB and 15 s for 4 x 50,000 x 2,000).
    Each row's frequencies follow p / sum(p) (within 5 sigma); zero categories,
    leading, inner and trailing, are never drawn; one positive category only."""
    p = torch.tensor([[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]], dtype=dtype)
    n = 20000
    torch.manual_seed(0)
    s = torch.multinomial(tpu(p), n, replacement=True)
    assert s.shape == (3, n) and s.dtype == torch.int64
    for row, probs in zip(s.cpu(), p.double()):
        freq = torch.bincount(row, minlength=7).double() / n
        want = probs / probs.sum()
        assert (freq[want == 0] == 0).all(), freq
        sigma = (want * (1 - want) / n).sqrt()
        assert ((freq - want).abs() <= 5 * sigma + 1e-12).all(), (freq, want)


def test_multinomial_more_samples_than_positive_categories(no_cpu_fallback):
    # CPU does not refuse this without replacement; nor does tpu: the positive one first.
    s = torch.multinomial(tpu(torch.tensor([0.0, 0.5, 0.0])), 2)
    assert s.cpu()[0] == 1 and s.cpu()[1] != 1


def test_multinomial_forms_and_seeding(no_cpu_fallback):
    p = tpu(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.manual_seed(3)
    a = torch.multinomial(p, 4)
    torch.manual_seed(3)
    b = torch.multinomial(p, 4)
    assert torch.equal(a.cpu(), b.cpu()) and sorted(a.cpu().tolist()) == [0, 1, 2, 3]  # a permutation
    assert torch.multinomial(p, 10, replacement=True).shape == (10,)
    with pytest.raises(RuntimeError, match="cannot sample n_sample <= 0 samples"):  # as CPU
        torch.multinomial(p, 0)
    out = torch.empty(3, dtype=torch.int64, device="tpu")
    torch.multinomial(p, 3, out=out)
    assert len(set(out.cpu().tolist())) == 3


@pytest.mark.parametrize("probs,kwargs", [
    ([0.5, -0.1, 0.6], {}), ([0.5, float("nan")], {}), ([float("inf"), 1.0], {}), ([0.0, 0.0], {}),
])
def test_multinomial_bad_probabilities_raise_like_cpu(probs, kwargs):
    n = kwargs.get("num_samples", 1)
    with pytest.raises(RuntimeError) as cpu:
        torch.multinomial(torch.tensor(probs), n)
    with pytest.raises(type(cpu.value)):
        torch.multinomial(tpu(torch.tensor(probs)), n).cpu()


BAD_RANDOM = {
    "int8 random_ from below": (lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(-200, 5), RuntimeError),
    "int8 random_ to above": (lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(1000), RuntimeError),
    "bool random_ to above": (lambda d: torch.empty(3, dtype=torch.bool, device=d).random_(0, 5), RuntimeError),
    "uniform_ to inf": (lambda d: torch.empty(2, device=d).uniform_(0, float("inf")), RuntimeError),
    "uniform_ span over max": (lambda d: torch.empty(2, device=d).uniform_(-3e38, 3e38), RuntimeError),
    "rand of int64": (lambda d: torch.rand(2, dtype=torch.int64, device=d), NotImplementedError),
    "normal of a negative std tensor": (lambda d: torch.normal(0.0, torch.tensor([-1.0], device=d)), RuntimeError),
}


@pytest.mark.parametrize("name", list(BAD_RANDOM))
def test_random_op_argument_checks_as_cpu(name):
    """CPU's DistributionTemplates checks (bounds of the dtype, a finite range,
    integer dtypes for uniform_, a tensor std >= 0): they were silent on tpu."""
    fn, error = BAD_RANDOM[name]
    with pytest.raises(error):
        fn("cpu")
    with pytest.raises(error):
        fn("tpu").cpu()


def test_random_bounds_at_the_edges_of_the_dtype_still_run():
    for dtype, lo, hi in [(torch.int8, -128, 128), (torch.uint8, 0, 256), (torch.bool, 0, 2),
                          (torch.int64, -2**63, 2**63 - 1)]:
        r = torch.empty(1000, dtype=dtype, device="tpu").random_(lo, hi).cpu()
        assert r.dtype == dtype and int(r.min()) >= lo and int(r.max()) < hi


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lambd", [1.0, 2.5])
def test_exponential_(dtype, lambd, no_cpu_fallback):
    # Exp(lambd): mean 1/lambd, variance 1/lambd^2, never 0 (CUDA's rule; Gumbel
    # noise is -log of these). 200k samples: the means' standard error is 0.2%.
    x = torch.empty(200_000, device="tpu", dtype=dtype).exponential_(lambd).cpu().double()
    assert x.min() > 0
    assert x.mean().item() == pytest.approx(1 / lambd, rel=0.02)
    assert x.var().item() == pytest.approx(1 / lambd ** 2, rel=0.05)
    torch.manual_seed(7)
    a = torch.empty(9, device="tpu", dtype=dtype).exponential_(lambd).cpu()
    torch.manual_seed(7)
    assert torch.equal(torch.empty(9, device="tpu", dtype=dtype).exponential_(lambd).cpu(), a)


def test_exponential_errors_and_gumbel_softmax(no_cpu_fallback):
    with pytest.raises(RuntimeError, match="lambda > 0.0"):
        torch.empty(3, device="tpu").exponential_(-1.0)
    with pytest.raises(RuntimeError, match="continuous probability distribution"):
        torch.empty(3, device="tpu", dtype=torch.long).exponential_()
    y = torch.nn.functional.gumbel_softmax(torch.randn(64, 10, device="tpu"), tau=0.5, hard=True)
    assert torch.equal(y.sum(-1).cpu(), torch.ones(64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.bool])
def test_randn_of_an_integer_dtype_as_cpu(dtype):
    # CPU: an empty result is returned, a non-empty one raises NotImplementedError.
    assert torch.randn(0, dtype=dtype, device="tpu").shape == (0,)
    with pytest.raises(NotImplementedError, match="normal_kernel_cpu"):
        torch.randn(3, dtype=dtype, device="tpu")


def test_random_op_errors_are_cpus_and_leave_the_cpu_generator_alone():
    # PyTorch's Meta kernel of multinomial words it otherwise; CPU's kernel is
    # asked (OpInfo error_inputs match CPU's text), its generator kept as it was.
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="^prob_dist must be 1 or 2 dim"):
        torch.multinomial(torch.rand(1, 2, 3, device="tpu"), 2)
    assert torch.equal(torch.rand(4), want)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range, but found from=3 > to=-1"):
        torch.empty(10, device="tpu").uniform_(3, -1)
    with pytest.raises(RuntimeError, match="multinomial only supports floating-point dtypes for input, got: Long"):
        torch.multinomial(torch.ones(1, 2, dtype=torch.int64, device="tpu"), 2)


@pytest.mark.parametrize("call,match", [
    (lambda d: torch.multinomial(torch.ones(2, device=d, dtype=torch.float64), 0), "cannot sample n_sample <= 0"),
    (lambda d: torch.multinomial(torch.ones(2, device=d), 3), "cannot sample n_sample > prob_dist.size"),
    (lambda d: torch.multinomial(torch.ones(1, 2, dtype=torch.float64, device=d), 2,
                                 out=torch.empty(1, 2, dtype=torch.float64, device=d)),
     "multinomial expects Long tensor out, got: Double"),
])
def test_multinomial_argument_errors_as_cpu(call, match):
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match=match):
            call(dev)


@pytest.mark.parametrize("call, bad_values", [
    (lambda t, a, b: t.normal_(a, b), [(0.0, -1.0), (1.0, -0.5)]),
    (lambda t, a, b: t.uniform_(a, b), [(2.0, 1.0), (0.0, -3.0)]),
    (lambda t, a, b: t.bernoulli_(a + b / 10), [(1.5, 0.0), (-1.0, 0.0)]),
], ids=["normal_", "uniform_", "bernoulli_"])
def test_values_checked_once_are_still_checked_for_new_values(call, bad_values):
    # Float values the Meta check accepted for a program are not checked again
    # (each normal_(0, 1) ran PyTorch's Python Meta kernel: 0.24 ms a call);
    # other values still are, also after the remembered ones roll over.
    t = torch.empty(8, device="tpu")
    good = [(0.0, 1.0)] * 3 + [(0.1 * k, 0.2 * k + 1.0) for k in range(12)] + [(0.0, 1.0)]
    for a, b in good:
        try:
            call(t, a, b)
            t.cpu()
        except RuntimeError:  # (bernoulli_'s p past 1 for the larger k: CPU raises too)
            with pytest.raises(RuntimeError):
                call(torch.empty(8), a, b)
    for a, b in bad_values:
        with pytest.raises(RuntimeError) as cpu_err:
            call(torch.empty(8), a, b)
        with pytest.raises(RuntimeError) as tpu_err:
            call(t, a, b)
            t.cpu()  # (bernoulli_'s p is checked on the device: raised at the next read)
        cpu_words = str(cpu_err.value).split(",")[0].split("(")[0].strip()
        assert cpu_words.split()[-1] in str(tpu_err.value), (cpu_err.value, tpu_err.value)
    assert t.isfinite().all().item()


# ---- random ops that run on the CPU fallback ------------------------------------------------

FALLBACK_RANDOM = {
    "poisson": lambda d, g: torch.poisson(torch.full((64,), 3.0, device=d), generator=g),
    "binomial": lambda d, g: torch.binomial(torch.full((64,), 9.0, device=d),
                                            torch.full((64,), 0.4, device=d), generator=g),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_RANDOM))
def test_fallback_random_op_takes_a_tpu_generator(name):
    # CPU kernels take only CPU generators; the fallback runs them from the tpu
    # generator's state (CPU's engine), so a seed gives CPU's own numbers.
    call = FALLBACK_RANDOM[name]
    g = torch.Generator(device="tpu").manual_seed(11)
    first = call("tpu", g).cpu()
    second = call("tpu", g).cpu()
    want = call("cpu", torch.Generator().manual_seed(11))
    torch.testing.assert_close(first, want, rtol=0, atol=0)
    assert not torch.equal(first, second)  # the tpu generator advanced
    g.manual_seed(11)
    assert torch.equal(call("tpu", g).cpu(), first)


@pytest.mark.parametrize("name", ["poisson"])
def test_fallback_random_op_follows_tpu_manual_seed(name):
    call = FALLBACK_RANDOM[name]
    torch.tpu.manual_seed(5)
    a = call("tpu", None).cpu()
    torch.manual_seed(123)  # CPU's generator alone is reseeded; tpu's keeps its place
    torch.tpu.manual_seed(5)
    assert torch.equal(call("tpu", None).cpu(), a)


@pytest.mark.parametrize("n,dtype", [(0, torch.int64), (1, torch.int64), (50, torch.int64), (256, torch.uint8),
                                     (1000, torch.float32), (5000, torch.int32), (70000, torch.int64),
                                     (40, torch.bfloat16)])
def test_randperm_draws_a_permutation_on_the_device(n, dtype, no_cpu_fallback):
    # Lowered (it ran on the CPU fallback, warning, and cut compiled graphs:
    # transformers' watermarking draws one per token).
    torch.tpu.manual_seed(7)
    p = torch.randperm(n, dtype=dtype, device="tpu").cpu()
    assert p.dtype == dtype and p.shape == (n,)
    assert torch.equal(p.double().sort().values, torch.arange(n, dtype=torch.float64))
    if n >= 50:
        assert not torch.equal(p, torch.arange(n, dtype=dtype))


def test_randperm_follows_seeds_generators_and_out(no_cpu_fallback):
    g = torch.Generator(device="tpu").manual_seed(3)
    a, b = (torch.randperm(64, generator=g, device="tpu").cpu() for _ in range(2))
    g.manual_seed(3)
    assert torch.equal(torch.randperm(64, generator=g, device="tpu").cpu(), a) and not torch.equal(a, b)
    torch.tpu.manual_seed(5)
    c = torch.randperm(64, device="tpu").cpu()
    torch.tpu.manual_seed(5)
    assert torch.equal(torch.randperm(64, device="tpu").cpu(), c)
    out = torch.empty(0, dtype=torch.int64, device="tpu")
    assert torch.randperm(9, out=out) is out and torch.equal(out.cpu().sort().values, torch.arange(9))
    # Each of 5 values first equally often: 4,000 draws, chi-square with 4
    # degrees of freedom below 18.5 (p = 0.001; the draws are seeded).
    torch.tpu.manual_seed(0)
    firsts = torch.stack([torch.randperm(5, device="tpu")[0] for _ in range(4000)]).cpu()
    counts = torch.bincount(firsts, minlength=5).double()
    assert ((counts - 800) ** 2 / 800).sum() < 18.5, counts


def test_randperm_errors_as_cpu():
    with pytest.raises(NotImplementedError, match="\"randperm\" not implemented for 'Bool'"):
        torch.randperm(3, dtype=torch.bool, device="tpu")
    for n, dtype in [(300, torch.uint8), (5000, torch.int8)]:
        with pytest.raises(RuntimeError):
            torch.randperm(n, dtype=dtype, device="tpu").cpu()
    with pytest.raises(RuntimeError, match="negative dimension"):
        torch.randperm(-1, device="tpu")


def test_lowered_random_ops_take_a_tpu_generator():
    # exponential_'s meta check is PyTorch's Python ref, which refuses generators.
    for call in (lambda g: torch.zeros(32, device="tpu").exponential_(2.0, generator=g),
                 lambda g: torch.zeros(32, device="tpu").uniform_(generator=g)):
        a = call(torch.Generator(device="tpu").manual_seed(3)).cpu()
        b = call(torch.Generator(device="tpu").manual_seed(3)).cpu()
        c = call(torch.Generator(device="tpu").manual_seed(4)).cpu()
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_distributions_sampled_on_the_fallback_reproduce_cpu_after_manual_seed():
    # _standard_gamma, _sample_dirichlet and poisson run on the CPU from the tpu
    # generator, which torch.manual_seed seeds as CPU's: the same draws.
    import torch.distributions as D
    out = {}
    for dev in ("cpu", "tpu"):
        torch.manual_seed(0)
        a = torch.tensor([2.0, 3.0], device=dev, requires_grad=True)
        x = D.Gamma(a, torch.ones(2, device=dev)).rsample((5,))
        x.sum().backward()
        y = D.Dirichlet(torch.tensor([1.0, 2.0, 3.0], device=dev)).sample((3,))
        z = D.Poisson(torch.tensor([3.0, 4.0], device=dev)).sample((3,))
        out[dev] = [x.detach(), a.grad, y, z]
    for t, c in zip(out["tpu"], out["cpu"]):
        assert t.device.type == "tpu"
        torch.testing.assert_close(t.cpu(), c, rtol=1e-5, atol=1e-5)


def test_cloned_tpu_generator_stays_a_tpu_generator():
    g = torch.Generator(device="tpu").manual_seed(3)
    c = g.clone_state()
    assert c.device.type == "tpu"
    assert torch.equal(torch.rand(5, device="tpu", generator=c).cpu(), torch.rand(5, device="tpu", generator=g).cpu())


def test_a_cpu_generator_on_a_tpu_op_is_refused_lowered_or_not():
    g = torch.Generator().manual_seed(0)
    for call in (lambda: torch.rand(3, device="tpu", generator=g),
                 lambda: torch.zeros(3, device="tpu").cauchy_(generator=g)):  # (the second runs on the CPU)
        with pytest.raises(RuntimeError, match="expected a tpu generator, got one for cpu"):
            call()


def test_a_tpu_generator_on_a_cpu_op_gives_cpus_error():
    g = torch.Generator(device="tpu").manual_seed(0)
    for call in (lambda: torch.poisson(torch.ones(3), generator=g), lambda: torch.randperm(5, generator=g),
                 lambda: torch.rand(5, generator=g), lambda: torch.zeros(3).normal_(generator=g)):
        with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'tpu'"):
            call()


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_cauchy_log_normal_and_geometric_draw_on_device(dt, no_cpu_fallback):
    """cauchy_, log_normal_ and geometric_ (they ran on the CPU): 200,000
    draws each, their medians, quartiles and moments against the
    distribution's (tolerances ~5 standard errors)."""
    torch.manual_seed(0)
    n = 200_000
    c = torch.empty(n, dtype=dt, device="tpu").cauchy_(1.0, 2.0).cpu().double()
    assert abs(c.median().item() - 1.0) < 0.05
    assert abs((c.quantile(0.75) - c.quantile(0.25)).item() / 2 - 2.0) < 0.05  # half the IQR is sigma
    logs = torch.empty(n, dtype=dt, device="tpu").log_normal_(0.5, 0.25).cpu().double().log()
    assert abs(logs.mean().item() - 0.5) < 0.005 and abs(logs.std().item() - 0.25) < 0.005
    for gdt in (dt, torch.int64):
        g = torch.empty(n, dtype=gdt, device="tpu").geometric_(0.3).cpu().double()
        assert g.min().item() == 1 and torch.equal(g, g.round())
        assert abs(g.mean().item() - 1 / 0.3) < 0.04 and abs(g.var().item() - 0.7 / 0.09) < 0.4


def test_cauchy_log_normal_and_geometric_reject_bad_arguments_as_cpu():
    for f in (lambda t: t.cauchy_(0, -1), lambda t: t.log_normal_(1, 0), lambda t: t.geometric_(1.5),
              lambda t: t.long().cauchy_(), lambda t: t.long().log_normal_()):
        check_raises(f, torch.empty(3))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_tpu_generator_copies_and_pickles_with_its_stream(how):
    """Generator.__reduce__ asks a non-CPU generator for its offset; the tpu generator's
    CPU-style engine raised there (a SystemError from __reduce__)."""
    import copy
    import pickle

    g = torch.Generator(device="tpu").manual_seed(5)
    torch.rand(3, device="tpu", generator=g)  # advance the stream first
    g2 = copy.deepcopy(g) if how == "deepcopy" else pickle.loads(pickle.dumps(g))
    assert g2.device == g.device and g2.initial_seed() == 5
    assert torch.equal(torch.rand(5, device="tpu", generator=g2).cpu(), torch.rand(5, device="tpu", generator=g).cpu())
    assert g.get_offset() == 0
    g.set_offset(0)
    with pytest.raises(RuntimeError, match="offset"):  # CPU's engine has no offset: CPU's error
        g.set_offset(4)
