"""Small runtime inputs (float scalars, storage offsets) come from a table of
constant device buffers (csrc/runtime/constant_buffers.h): a repeated value
makes no new host-to-device copy, every value still reaches the program, and
the table is neither counted as tensor memory nor unbounded."""
import torch

import torch_pjrt


def h2d():
    return torch_pjrt.metrics()["host_to_device_bytes"]


def test_repeated_scalar_makes_no_new_transfer_and_values_match_cpu():
    x_cpu = torch.randn(16)
    x = x_cpu.to("tpu")
    torch.testing.assert_close((x + 2.5).cpu(), x_cpu + 2.5, rtol=0, atol=0)  # program and constant made
    before = h2d()
    for _ in range(50):
        y = x + 2.5
    after = h2d()
    torch.testing.assert_close(y.cpu(), x_cpu + 2.5, rtol=0, atol=0)
    assert after == before, f"{after - before} bytes copied to the device for a repeated scalar"


def test_every_value_reaches_the_program_beyond_the_table_bound():
    # More distinct values than the table keeps (it starts again when full):
    # each result is that value's, never another entry's.
    x_cpu = torch.randn(8)
    x = x_cpu.to("tpu")
    values = [0.125 * i - 40.0 for i in range(700)]
    outs = [x * v for v in values]
    for v, out in zip(values, outs):
        torch.testing.assert_close(out.cpu(), x_cpu * v, rtol=0, atol=0)
    assert 0 < torch_pjrt.metrics()["constant_buffers"] <= 512


def test_constants_are_not_counted_as_tensor_memory():
    x = torch.randn(32, device="tpu")
    (x + 1.0).cpu()  # the program exists
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    y = x + 7.8125  # a value not seen before: a new constant
    y.cpu()
    del y
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base


def test_view_offsets_read_right_and_repeat_without_transfers():
    base_cpu = torch.arange(64, dtype=torch.float32)
    base = base_cpu.to("tpu")
    # Twice: the table starts again when full (kMaxEntries), which earlier
    # tests in this process may make happen during the first pass.
    for _ in range(2):
        for i in range(60):
            torch.testing.assert_close(base[i:i + 4].mul(2).cpu(), base_cpu[i:i + 4] * 2, rtol=0, atol=0)
    before = h2d()
    outs = [base[i:i + 4].mul(2) for i in range(60)]
    assert h2d() == before
    for i, out in enumerate(outs):
        torch.testing.assert_close(out.cpu(), base_cpu[i:i + 4] * 2, rtol=0, atol=0)


def test_fused_traces_with_constant_packs_match_cpu():
    x_cpu = torch.randn(4, 8)
    x = x_cpu.to("tpu")
    with torch_pjrt.fused():
        results = []
        for step in range(6):
            y = (x * 0.5 + step * 0.25).relu()[1:3] - 1.5
            results.append(y.cpu())
    for step, got in enumerate(results):
        torch.testing.assert_close(got, ((x_cpu * 0.5 + step * 0.25).relu()[1:3] - 1.5), rtol=1e-6, atol=1e-6)


def test_values_equal_as_numbers_but_not_as_bits_stay_apart():
    # 0.0 and -0.0 compare equal, NaNs never do: the table keys by bytes, so
    # x * 0.0 and x * -0.0 keep their signs and NaN / inf pass through.
    x_cpu = torch.tensor([1.0, -2.0, 3.0])
    x = x_cpu.to("tpu")
    for v in (0.0, -0.0, 0.0, -0.0, float("nan"), float("inf"), float("-inf"), float("nan")):
        got, want = (x * v).cpu(), x_cpu * v
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), v
