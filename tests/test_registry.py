"""The lowering registry: names are real ATen ops, and the docs table is generated from it."""
import os
import sys

import torch
import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma, which compiled graphs can hold; otherwise only after another test imported it)

import torch_pjrt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_ops_table  # noqa: E402


def test_every_lowering_names_an_aten_op():
    # (or a prims op: AOTAutograd's decompositions leave a few in compiled graphs)
    for name in torch_pjrt.supported_ops():
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base, None) or getattr(torch.ops.prims, base, None)
        assert packet is not None, f"{name} is not an ATen or prims op"
        if overload:
            assert overload in packet.overloads(), f"{name}: no overload {overload}"


def test_supported_ops_table_is_current():
    with open(gen_ops_table.TARGET) as f:
        assert f.read() == gen_ops_table.render(), \
            "docs/supported_ops.md is stale: run python scripts/gen_ops_table.py"
