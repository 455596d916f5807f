"""tpu tensors through torch.multiprocessing (Queue, spawned Process arguments,
DataLoader workers): sent as copies (torch_pjrt/_mp_reductions.py). Before,
pickling raised "_share_fd_: only available on CPU" in a Queue's feeder thread,
so the receiver waited forever. Every wait is bounded, so a hang fails."""
import os
import sys
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))
import mp_worker  # noqa: E402

TIMEOUT = 120


def test_queue_from_a_spawned_child_carries_tpu_tensors():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=mp_worker.send_tensors, args=(q,))
    p.start()
    try:
        got = q.get(timeout=TIMEOUT)
    finally:
        p.join(TIMEOUT)
    base = torch.arange(12.0).reshape(3, 4)
    want = {"f32": base * 2, "view": base.t()[1:], "bf16": base.to(torch.bfloat16) / 3, "bool": base > 5,
            "int64_0d": torch.tensor(7), "empty": torch.empty(0, 3), "param": base}
    for k, w in want.items():
        assert got[k].device.type == "tpu", k
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        torch.testing.assert_close(got[k].cpu(), w, rtol=0, atol=0)
    assert isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad
    storage = got["storage"]
    assert storage.device.type == "tpu"
    torch.testing.assert_close(torch.empty(0).set_(storage.cpu()).view(3, 4), base + 1, rtol=0, atol=0)


def test_spawned_process_gets_a_tpu_module_as_argument():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2).to("tpu")
    m.share_memory()  # what Hogwild code does; a no-op on tpu, as on CUDA
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with warnings.catch_warnings(record=True):
        p = ctx.Process(target=mp_worker.report_parameters, args=(m, q))
        p.start()
    try:
        got = q.get(timeout=TIMEOUT)
    finally:
        p.join(TIMEOUT)
    assert p.exitcode == 0
    for (name, dev, rg, value), (n, param) in zip(got, m.named_parameters()):
        assert (name, dev, rg) == (n, "tpu", True)
        torch.testing.assert_close(torch.tensor(value), param.detach().cpu(), rtol=0, atol=0)


def test_dataloader_spawn_workers_return_tpu_tensors():
    loader = DataLoader(mp_worker.TpuRows(), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                        timeout=TIMEOUT)
    batches = [b for b in loader]
    assert all(b.device.type == "tpu" for b in batches)
    torch.testing.assert_close(torch.cat([b.cpu() for b in batches]),
                               torch.arange(6.0).repeat_interleave(2).reshape(6, 2))


def test_sending_warns_once_and_non_leaf_tensors_are_refused():
    from multiprocessing.reduction import ForkingPickler
    import io

    import torch_pjrt._mp_reductions as red
    red._warned = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ForkingPickler(io.BytesIO()).dump(torch.ones(2, device="tpu"))
    assert sum("copied" in str(w.message) for w in caught) == 1
    # A DataLoader worker's batches: no warning.
    red._warned = False
    import torch.utils.data._utils.worker as worker
    saved, worker._worker_info = worker._worker_info, object()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ForkingPickler(io.BytesIO()).dump(torch.ones(2, device="tpu"))
    finally:
        worker._worker_info = saved
    assert not [w for w in caught if "copied" in str(w.message)]
    x = torch.ones(2, device="tpu", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="non-leaf tensor"):
        ForkingPickler(io.BytesIO()).dump(x)
    # CPU tensors keep torch's own (shared memory) path
    assert ForkingPickler._extra_reducers[torch.Tensor](torch.ones(2))[0].__module__ == "torch.multiprocessing.reductions"


def test_pickling_under_the_default_device_tpu():
    """ForkingPickler's reducers build their host copies on the CPU even under
    `with torch.device("tpu")` (a bare torch.empty() there is a tpu tensor,
    and setting it to a CPU storage raised)."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler
    t = torch.arange(6.0).reshape(2, 3).to("tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("tpu"):
            buf = io.BytesIO()
            ForkingPickler(buf).dump((t, t.untyped_storage(), torch.empty(0, 4, device="tpu")))
            back, storage, empty = pickle.loads(buf.getvalue())
    assert back.device.type == "tpu" and torch.equal(back.cpu(), t.cpu())
    assert storage.device.type == "tpu" and storage.nbytes() == 24
    assert empty.device.type == "tpu" and empty.shape == (0, 4)
