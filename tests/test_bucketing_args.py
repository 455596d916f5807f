"""torch_pjrt.bucketed's arguments are checked when it is built, each
mistake a TypeError/ValueError naming the argument (they surfaced at the
first call, deep in torch.full or as an IndexError, or never). CPU tensors:
nothing here needs the device."""
import re

import pytest
import torch

import torch_pjrt


def f(x, idx, mask=None, *, scale=1.0):
    return idx


@pytest.mark.parametrize("kwargs,error,says", [
    ({"sizes": "8"}, TypeError, "sizes must be a list of positive ints, got '8'"),
    ({"sizes": 8}, TypeError, "sizes must be a list of positive ints, got 8"),
    ({"sizes": [4.5]}, TypeError, "sizes[0] must be an int, got 4.5"),
    ({"sizes": [8, True]}, TypeError, "sizes[1] must be an int, got True"),
    ({"sizes": []}, ValueError, "sizes is empty"),
    ({"sizes": [8, 0]}, ValueError, "bucket sizes must be positive, got [8, 0]"),
    ({"dims": ["idx"]}, TypeError, "dims must be a dict {argument name or position: dimension}, got ['idx']"),
    ({"dims": {5: 1}}, ValueError, "dims names position 5, but the function takes 3 positional argument(s)"),
    ({"dims": {-1: 1}}, ValueError, "dims names position -1"),
    ({"dims": {"idx": 1.0}}, TypeError, "dims['idx'] must be an int, got 1.0"),
    ({"dims": {1: 1, "idx": 1}}, ValueError, "dims names one argument twice"),
    ({"dims": {"idx": 1}, "pad_values": {"nope": -100}}, ValueError, "pad_values names 'nope', not among the"),
    ({"dims": {"idx": 1}, "pad_values": {"x": -100}}, ValueError, "pad_values names 'x', which dims does not pad"),
    ({"dims": {"idx": 1}, "pad_values": {7: -100}}, ValueError, "pad_values names position 7"),
    ({"dims": {"idx": 1}, "pad_values": {"idx": "a"}}, TypeError, "pad_values['idx'] must be a number, got 'a'"),
    ({"dims": {"idx": 1}, "pad_values": [0]}, TypeError, "pad_values must be a dict"),
    ({"output_dim": "1"}, TypeError, "output_dim must be an int, got '1'"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, error, says):
    args = dict(dims={"idx": 1}, sizes=[8])
    args.update(kwargs)
    with pytest.raises(error, match=re.escape(says)):
        torch_pjrt.bucketed(f, **args)


def test_positions_name_the_positional_parameters():
    # A position is the parameter's place in the signature, also when an
    # earlier optional argument is left out (it indexed the arguments given).
    def g(x, mask=None, idx=None):
        return idx
    b = torch_pjrt.bucketed(g, dims={2: 1}, sizes=[8], pad_values={2: -1})
    out = b(torch.ones(2), idx=torch.ones(2, 3))
    assert out.shape == (2, 3)
    seen = {}
    torch_pjrt.bucketed(lambda x, idx: seen.setdefault("idx", idx), dims={1: 1}, sizes=[8],
                        pad_values={1: -1})(None, torch.ones(2, 3))
    assert seen["idx"].shape == (2, 8) and seen["idx"][0].tolist() == [1, 1, 1] + [-1] * 5


def test_pad_values_reach_their_argument_and_bool_masks_pad_with_false():
    seen = {}

    def h(idx, mask):
        seen.update(idx=idx, mask=mask)
        return idx
    b = torch_pjrt.bucketed(h, dims={"idx": 1, "mask": 1}, sizes=[4], pad_values={"idx": 7, "mask": False})
    out = b(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool))
    assert out.shape == (1, 3)
    assert seen["idx"].tolist() == [[0, 0, 0, 7]] and seen["mask"].tolist() == [[True, True, True, False]]


def test_dimension_beyond_the_tensor_names_the_argument():
    b = torch_pjrt.bucketed(f, dims={"idx": 3}, sizes=[8])
    with pytest.raises(ValueError, match="dims pads dimension 3 of argument 'idx', which has 2 dimension"):
        b(None, torch.ones(2, 3))
