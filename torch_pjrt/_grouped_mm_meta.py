"""aten::_grouped_mm's Meta kernel for the dtypes its eager kernels take.

PyTorch's Meta kernel (torch 2.13, ``_meta_registrations._meta_grouped_mm_common``)
accepts bfloat16 operands only, the CUDA fast path's restriction; the eager
kernels (CPU, CUDA's fallback, the CompositeExplicitAutograd one tpu runs)
multiply any floating dtype. transformers sends Mixture-of-Experts layers on
tpu to ``torch._grouped_mm`` in every dtype (integrations/moe.py), so
torch.compile's FakeTensor propagation of a float32 Mixtral failed at the
Meta kernel. ``install`` lets unscaled operands of one floating dtype
(float8 aside) through with the kernel's other checks and its result tensor;
every other call goes to PyTorch's checks unchanged."""
import torch

_original = None


def _common(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
            use_fast_accum=False):
    import torch._meta_registrations as meta_registrations
    if (scale_a is not None or scale_b is not None or mat_a.dtype != mat_b.dtype
            or not mat_a.dtype.is_floating_point or mat_a.dtype.itemsize == 1 or mat_a.dtype == torch.bfloat16):
        return _original(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype, use_fast_accum)
    torch._check(mat_a.dim() in [2, 3] and mat_b.dim() in [2, 3],
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and "
                         f"mat_b.dim()={mat_b.dim()}")
    if mat_a.dim() == 3 or mat_b.dim() == 3:
        torch._check(mat_a.size(-1) == mat_b.size(-2), lambda: "contraction dimension of mat_a and mat_b must match")
    if mat_a.dim() == 2 or mat_b.dim() == 2:
        torch._check(offs is not None, lambda: f"Offsets tensor not provided, but is needed for {mat_a.dim()}D/"
                                               f"{mat_b.dim()}D multiplicand layouts.")
        torch._check(offs.dim() == 1, lambda: f"Offsets tensor must be 1D, but got offs.dim()={offs.dim()}.")
        torch._check(offs.dtype == torch.int32,
                     lambda: f"Offsets tensor must be integer (int32) tensor, but got {offs.dtype}.")
    else:
        torch._check(offs is None, lambda: "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.")
    torch._check(bias is None, lambda: "Bias tensor provided, but it is not supported yet.")
    torch._check(out_dtype is None or out_dtype == mat_a.dtype,
                 lambda: f"If output dtype provided, it must be {mat_a.dtype}.")
    return meta_registrations._create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


def install():
    global _original
    if _original is not None:
        return
    import torch._meta_registrations as meta_registrations
    if not hasattr(meta_registrations, "_meta_grouped_mm_common") or not hasattr(
            meta_registrations, "_create_grouped_mm_output_tensor"):
        return
    _original = meta_registrations._meta_grouped_mm_common
    meta_registrations._meta_grouped_mm_common = _common
