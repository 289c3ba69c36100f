"""Backward ops (backward.py) and ops models need (misc.py) against eager PyTorch on the CPU."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import check, grads_match  # noqa: E402

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("sizes,offset,dim1,dim2", [
    ([4, 5], 0, 0, 1), ([4, 5], 2, 0, 1), ([4, 5], -1, 1, 0), ([2, 3, 4], 1, -1, 0),
])
def test_diagonal_backward(sizes, offset, dim1, dim2):
    grad = torch.diagonal(torch.randn(sizes), offset, dim1, dim2).contiguous()
    check(lambda g: aten.diagonal_backward(g, sizes, offset, dim1, dim2), grad)


@pytest.mark.parametrize("sizes,dim,size,step", [
    ([10], 0, 3, 2), ([10], 0, 3, 3), ([10], 0, 2, 4), ([3, 9, 2], 1, 4, 1), ([3, 9, 2], -1, 1, 1),
    ([], 0, 1, 1),
])
def test_unfold_backward(sizes, dim, size, step):
    grad = torch.randn(sizes).unfold(dim, size, step).contiguous()
    grad = torch.randn_like(grad, dtype=torch.float64)
    check(lambda g: aten.unfold_backward(g, sizes, dim, size, step), grad)


def test_unfold_and_diagonal_grads():
    grads_match(lambda x: (x.unfold(1, 3, 2).sin().sum() + x.diagonal(1).pow(2).sum()),
                [torch.randn(6, 7)])


@pytest.mark.parametrize("dim", [0, 2])  # PyTorch's fused kernel: first or last dim only
def test_weight_norm_interface_backward(dim):
    v, g = torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(4, 1, 1, dtype=torch.float64)
    if dim == 2:
        g = torch.randn(1, 1, 2, dtype=torch.float64)

    def backward(grad_w, v, g):
        w, norms = aten._weight_norm_interface(v, g, dim)
        return aten._weight_norm_interface_backward(grad_w, v, g, norms, dim)

    check(backward, torch.randn(4, 3, 2, dtype=torch.float64), v, g, jit=False)


@pytest.mark.parametrize("elements,tests", [
    (torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([0, 2, 7])),
    (torch.tensor([1.5, 2.0, -1.0]), torch.tensor([2, -1], dtype=torch.int32)),
    (torch.tensor([1, 2, 3], dtype=torch.int8), torch.tensor([[3.0], [1.0]])),
])
@pytest.mark.parametrize("invert", [False, True])
def test_isin(elements, tests, invert):
    check(lambda e, t: torch.isin(e, t, invert=invert), elements, tests)


def test_isin_scalars():
    check(lambda e: torch.isin(e, 3), torch.tensor([1, 3, 5]))
    check(lambda t: torch.isin(2, t), torch.tensor([1, 2]))
    check(lambda t: torch.isin(4, t, invert=True), torch.tensor([1, 2]))
