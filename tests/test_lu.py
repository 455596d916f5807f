"""LU factorization and what is built on it (csrc/lowering/ops/lu.cpp): lu_factor,
lu, lu_unpack, lu_solve, solve, inv, det, slogdet against CPU's LAPACK, values,
pivots, info, gradients, singular inputs, empty shapes and torch.compile."""
import pytest
import torch

import torch_pjrt
from conftest import assert_same, make, tpu

F64 = dict(rtol=1e-9, atol=1e-9)  # float64 results of the same algorithm, rounding apart


def rand(shape, seed, dtype=torch.float64):
    return make(shape, dtype=dtype, seed=seed)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 3, 4, 6), (6, 4), (1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lu_factor_lu_and_unpack_as_lapack(shape, dtype, no_cpu_fallback):
    a = rand(shape, 1, dtype)
    tol = F64 if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    c, t = torch.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(tpu(a))
    assert_same(t.LU, c.LU, **tol)
    assert_same(t.pivots, c.pivots)
    assert_same(t.info, c.info)
    assert_same(torch.linalg.lu(tpu(a)), torch.linalg.lu(a), **tol)
    assert_same(torch.lu_unpack(t.LU, t.pivots), torch.lu_unpack(c.LU, c.pivots), **tol)
    assert_same(torch.lu_unpack(t.LU, t.pivots, unpack_data=False), torch.lu_unpack(c.LU, c.pivots, unpack_data=False))


# Orders from 16 on take the blocked factorization (panels of 8 columns):
# one panel and a bit, several, rectangular both ways, batched.
@pytest.mark.parametrize("shape", [(16, 16), (3, 37, 37), (40, 29), (29, 40), (2, 64, 64), (17, 50)])
def test_blocked_factorization_as_lapack(shape, no_cpu_fallback):
    a = rand(shape, 2)
    c, t = torch.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(tpu(a))
    assert_same(t.LU, c.LU, **F64)
    assert_same(t.pivots, c.pivots)
    assert_same(t.info, c.info)
    if shape[-1] == shape[-2]:
        b = rand(shape[:-1] + (3,), 3)
        assert_same(torch.linalg.solve(tpu(a), tpu(b)), torch.linalg.solve(a, b), **F64)
        assert_same(torch.linalg.inv(tpu(a)), torch.linalg.inv(a), **F64)
        assert_same(torch.linalg.slogdet(tpu(a)), torch.linalg.slogdet(a), **F64)


def test_blocked_factorization_singular_and_nonfinite_like_cpu():
    # Zero columns in the first and a later panel: info is the first zero
    # pivot's order; an inf in the trailing block must not turn the L of
    # earlier columns into NaN.
    a = rand((2, 40, 40), 4)
    a[0, :, 30] = 0
    a[1, :, 5] = 0
    a[1, :, 33] = 0
    c, t = torch.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(tpu(a))
    assert_same(t.info, c.info)
    assert_same(t.pivots, c.pivots)
    assert_same(t.LU, c.LU, **F64)
    b = rand((40, 40), 5)
    b[35, 38] = float("inf")
    c, t = torch.linalg.lu_factor_ex(b), torch.linalg.lu_factor_ex(tpu(b))
    assert_same(t.pivots, c.pivots)
    assert torch.equal(t.LU.cpu().isnan(), c.LU.isnan())
    assert_same(t.LU[:, :32], c.LU[:, :32], **F64)


def test_pivot_is_the_first_largest_magnitude():
    # Ties in magnitude (3 and -3) pick the first row, as LAPACK's idamax does.
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 1.0, 1.0], [-3.0, 5.0, 2.0]])
    assert torch.equal(torch.linalg.lu_factor(tpu(a)).pivots.cpu(), torch.linalg.lu_factor(a).pivots)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transposed", [False, True])
def test_solve_matrix_vector_and_broadcast(left, transposed, no_cpu_fallback):
    a, b = rand((3, 5, 5), 2), rand((3, 5, 2), 3)
    a = a.mT if transposed else a  # a non-contiguous A
    b = b if left else b.mT
    assert_same(torch.linalg.solve(tpu(a), tpu(b), left=left), torch.linalg.solve(a, b, left=left), **F64)
    assert_same(torch.linalg.solve(tpu(a[0]), tpu(b), left=left), torch.linalg.solve(a[0], b, left=left), **F64)
    if left:
        v = rand((5,), 4)
        assert_same(torch.linalg.solve(tpu(a), tpu(v)), torch.linalg.solve(a, v), **F64)
        assert_same(torch.linalg.solve(tpu(a), tpu(b[..., 0])), torch.linalg.solve(a, b[..., 0]), **F64)
    c, t = torch.linalg.solve_ex(a, b, left=left), torch.linalg.solve_ex(tpu(a), tpu(b), left=left)
    assert_same(t, c, **F64)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(left, adjoint, no_cpu_fallback):
    a, b = rand((3, 4, 4), 5), rand((3, 4, 2), 6)
    b = b if left else b.mT
    lu, piv = torch.linalg.lu_factor(a)
    assert_same(torch.linalg.lu_solve(tpu(lu), tpu(piv), tpu(b), left=left, adjoint=adjoint),
                torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint), **F64)


@pytest.mark.parametrize("transposed", [False, True])
def test_inv_det_slogdet_logdet(transposed, no_cpu_fallback):
    a = rand((2, 3, 5, 5), 7)
    a = a.mT if transposed else a
    assert_same(torch.linalg.inv(tpu(a)), torch.linalg.inv(a), **F64)
    assert_same(torch.linalg.inv_ex(tpu(a)), torch.linalg.inv_ex(a), **F64)
    assert_same(torch.linalg.det(tpu(a)), torch.linalg.det(a), **F64)
    assert_same(torch.linalg.slogdet(tpu(a)), torch.linalg.slogdet(a), **F64)
    spd = a @ a.mT
    assert_same(torch.logdet(tpu(spd)), torch.logdet(spd), **F64)
    # The factor det/slogdet return (and their backward solves with): CPU's,
    # A^T's for a contiguous A.
    assert_same(torch.ops.aten._linalg_det(tpu(a)), torch.ops.aten._linalg_det(a), **F64)
    assert_same(torch.ops.aten._linalg_slogdet(tpu(a)), torch.ops.aten._linalg_slogdet(a), **F64)
    assert_same(torch.ops.aten._linalg_solve_ex(tpu(a), tpu(a[..., :2])), torch.ops.aten._linalg_solve_ex(a, a[..., :2]),
                **F64)


GRADS = {
    "solve": lambda a, b: torch.linalg.solve(a, b),
    "solve_transposed": lambda a, b: torch.linalg.solve(a.mT, b),
    "solve_right": lambda a, b: torch.linalg.solve(a, b.mT, left=False),
    "solve_vector": lambda a, b: torch.linalg.solve(a, b[..., 0]),
    "inv": lambda a, b: torch.linalg.inv(a),
    "det": lambda a, b: torch.linalg.det(a),
    "det_transposed": lambda a, b: torch.linalg.det(a.mT),
    "slogdet": lambda a, b: torch.linalg.slogdet(a).logabsdet,
    "slogdet_transposed": lambda a, b: torch.linalg.slogdet(a.mT).logabsdet,
    "lu_factor": lambda a, b: torch.linalg.lu_factor(a).LU,
    "lu": lambda a, b: torch.cat([t.flatten() for t in torch.linalg.lu(a)[1:]]),
    "lu_solve": lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
}


@pytest.mark.parametrize("name", sorted(GRADS))
def test_gradients(name, no_cpu_fallback):
    f = GRADS[name]
    a, b = rand((3, 4, 4), 8), rand((3, 4, 2), 9)
    w = None
    grads = []
    for dev in ("cpu", "tpu"):
        x, y = a.clone().to(dev).requires_grad_(), b.clone().to(dev).requires_grad_()
        out = f(x, y)
        if w is None:
            w = rand(out.shape, 10)
        (out * w.to(dev)).sum().backward()
        grads.append((x.grad, y.grad))
    (gac, gbc), (gat, gbt) = grads
    assert_same(gat, gac, rtol=1e-8, atol=1e-8)
    if gbc is not None:
        assert_same(gbt, gbc, rtol=1e-8, atol=1e-8)


def test_singular_matrices_like_cpu():
    s = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    batch = torch.stack([torch.eye(2), s])
    assert_same(torch.linalg.lu_factor_ex(tpu(batch)), torch.linalg.lu_factor_ex(batch))
    assert_same(torch.linalg.inv_ex(tpu(batch)).info, torch.linalg.inv_ex(batch).info)
    assert_same(torch.linalg.det(tpu(batch)), torch.linalg.det(batch))
    assert_same(torch.linalg.slogdet(tpu(batch)), torch.linalg.slogdet(batch))  # sign 0, logabsdet -inf
    for fn, match in [(lambda x: torch.linalg.solve(x, torch.ones(2, device=x.device)), "singular"),
                      (torch.linalg.inv, "singular"), (torch.linalg.lu_factor, "is zero")]:
        with pytest.raises(torch.linalg.LinAlgError if fn is not torch.linalg.lu_factor else RuntimeError,
                           match=match):
            fn(tpu(s)).cpu()
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 1\): The solver failed"):
        torch.linalg.solve(tpu(batch), torch.ones(2, 2, device="tpu")).cpu()
    with pytest.raises(RuntimeError, match="singular"):  # check_errors=True inside the program
        torch.linalg.inv_ex(tpu(s), check_errors=True)[0].cpu()
    z = torch.zeros(3, 3)
    assert_same(torch.linalg.lu_factor_ex(tpu(z)), torch.linalg.lu_factor_ex(z))


def test_ex_check_errors_raise_at_the_call_with_cpus_message():
    # check_errors=True: CPU raises at the call, naming the order and the
    # batch element; nothing may be left pending for a later, unrelated read.
    s = torch.zeros(3, 3, dtype=torch.float64)
    s[0, 0] = 1
    calls = {
        "inv_ex": lambda x: torch.linalg.inv_ex(x, check_errors=True),
        "solve_ex": lambda x: torch.linalg.solve_ex(x, torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device),
                                                    check_errors=True),
        "lu_factor_ex": lambda x: torch.linalg.lu_factor_ex(x, check_errors=True),
        "cholesky_ex": lambda x: torch.linalg.cholesky_ex(x, check_errors=True),
    }
    for name, fn in calls.items():
        for x in (s, torch.stack([torch.eye(3, dtype=torch.float64), s])):
            with pytest.raises(Exception) as cpu:
                fn(x)
            with pytest.raises(Exception) as dev:
                fn(tpu(x))
            assert type(dev.value) is type(cpu.value), name
            assert str(cpu.value).split("\n")[0] in str(dev.value), (name, str(cpu.value), str(dev.value))
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 1"):
        torch.linalg.cholesky_ex(tpu(-torch.eye(3)), check_errors=True)
    # cholesky_ex's info is the first pivot that is not positive, as LAPACK's
    # (XLA's factor is all NaN for a failed matrix: a column loop finds it).
    a = torch.stack([torch.eye(4, dtype=torch.float64)] * 3)
    a[0, 2, 2] = -1
    a[1, 3, 3] = 0
    a[2, 1, 1] = float("nan")
    for upper in (False, True):
        assert_same(torch.linalg.cholesky_ex(tpu(a), upper=upper).info, torch.linalg.cholesky_ex(a, upper=upper).info)
    assert (torch.ones(2, device="tpu") * 2).sum().item() == 4.0
    ok = torch.eye(3, dtype=torch.float64) * 2
    assert_same(torch.linalg.inv_ex(tpu(ok), check_errors=True), torch.linalg.inv_ex(ok, check_errors=True))


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3), (3, 0), (0, 3)])
def test_empty_shapes(shape, no_cpu_fallback):
    x = torch.zeros(shape)
    assert_same(torch.linalg.lu(tpu(x)), torch.linalg.lu(x))
    assert_same(torch.linalg.lu_factor_ex(tpu(x)), torch.linalg.lu_factor_ex(x))
    if shape[-1] == shape[-2]:
        for f in (torch.linalg.det, torch.linalg.inv, torch.linalg.slogdet):
            assert_same(f(tpu(x)), f(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_dtypes_cpu_rejects_raise_the_same(dtype):
    for f in (lambda x: torch.linalg.solve(x, x), torch.linalg.inv, torch.linalg.det, torch.linalg.lu_factor):
        with pytest.raises(Exception) as cpu_error:
            f(torch.eye(2, dtype=dtype))
        with pytest.raises(type(cpu_error.value), match=str(cpu_error.value).split("\n")[0][:40]):
            f(torch.eye(2, dtype=dtype, device="tpu")).cpu()


def test_lu_without_pivoting_raises_as_cpu():
    with pytest.raises(RuntimeError, match="without pivoting"):
        torch.linalg.lu(tpu(torch.eye(3)), pivot=False)


def test_compiled_solve_det_slogdet_inv_and_gradients(no_cpu_fallback):
    def f(a, b):
        return (torch.linalg.solve(a, b).sum() + torch.linalg.det(a.mT).sum() + torch.linalg.slogdet(a)[1].sum()
                + torch.linalg.inv(a).sum())

    a, b = rand((3, 4, 4), 11), rand((3, 4, 2), 12)
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    f(ac, bc).backward()
    at, bt = tpu(a).requires_grad_(), tpu(b).requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(f, backend="tpu")(at, bt)
    out.backward()
    assert out.item() == pytest.approx(f(a, b).item(), rel=1e-10)
    assert_same(at.grad, ac.grad, rtol=1e-8, atol=1e-8)
    assert_same(bt.grad, bc.grad, rtol=1e-8, atol=1e-8)


def test_compiled_graph_keeps_linalg_error_checks_on_the_device():
    """_linalg_check_errors (an effectful op in the graph) is a device check:
    the graph is not cut around it, and a singular input still raises."""
    import warnings

    def f(a, b):
        spd = a @ a.mT + torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
        return torch.linalg.solve(a, b).sum() + torch.linalg.inv(a).sum() + torch.linalg.cholesky(spd).sum()

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu")
    a, b = rand((3, 4, 4), 13), rand((3, 4, 2), 14)
    before = torch_pjrt.metrics()["partitioned_graphs"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = cf(tpu(a), tpu(b))
    assert out.item() == pytest.approx(f(a, b).item(), rel=1e-10)
    assert not [w for w in seen if "cannot lower" in str(w.message)]
    assert torch_pjrt.metrics()["partitioned_graphs"] == before
    singular = a.clone()
    singular[1, 2] = singular[1, 1]
    with pytest.raises(torch.linalg.LinAlgError, match="torch.linalg.solve: The solver failed"):
        cf(tpu(singular), tpu(b)).item()
