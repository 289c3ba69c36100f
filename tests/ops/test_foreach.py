"""_foreach_* ops and torch.optim on the jax device against the CPU."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import assert_same, to_jax  # noqa: E402


def tensors(*shapes):
    return [torch.randn(*s) for s in shapes]


FOREACH = {
    "add_scalar": lambda a, b: torch._foreach_add(a, 1.5),
    "add_list_alpha": lambda a, b: torch._foreach_add(a, b, alpha=2),
    "add_scalarlist": lambda a, b: torch._foreach_add(a, [1.0, -2.0]),
    "sub_list": lambda a, b: torch._foreach_sub(a, b),
    "mul_scalar": lambda a, b: torch._foreach_mul(a, 3.0),
    "mul_tensor": lambda a, b: torch._foreach_mul(a, b[0].sum()),
    "div_list": lambda a, b: torch._foreach_div(a, b),
    "maximum_list": lambda a, b: torch._foreach_maximum(a, b),
    "clamp_min_scalar": lambda a, b: torch._foreach_clamp_min(a, 0.1),
    "neg": lambda a, b: torch._foreach_neg(a),
    "sqrt_abs": lambda a, b: torch._foreach_sqrt(torch._foreach_abs(a)),
    "pow_scalar": lambda a, b: torch._foreach_pow(a, 2),
    "pow_scalar_and_tensor": lambda a, b: torch._foreach_pow(2.0, a),
    "lerp_scalar": lambda a, b: torch._foreach_lerp(a, b, 0.3),
    "addcdiv": lambda a, b: torch._foreach_addcdiv(a, a, [x.abs() + 1 for x in b], 0.5),
    "addcmul_scalarlist": lambda a, b: torch._foreach_addcmul(a, a, b, [0.1, 0.2]),
    "norm": lambda a, b: torch._foreach_norm(a),
    "norm_inf": lambda a, b: torch._foreach_norm(a, float("inf")),
    "max": lambda a, b: torch._foreach_max(a),
}


@pytest.mark.parametrize("name", FOREACH)
def test_foreach_functional(name):
    torch.manual_seed(0)
    a, b = tensors((3,), (2, 2)), tensors((3,), (2, 2))
    expected = FOREACH[name](a, b)
    ja, jb = to_jax((a, b))
    with torchlax_core.enable():
        actual = FOREACH[name](ja, jb)
    assert_same(actual, expected, atol=1e-6, rtol=1e-6)


INPLACE = {
    "add_": lambda a, b: torch._foreach_add_(a, b, alpha=0.5),
    "mul_": lambda a, b: torch._foreach_mul_(a, 0.9),
    "maximum_": lambda a, b: torch._foreach_maximum_(a, b),
    "addcdiv_": lambda a, b: torch._foreach_addcdiv_(a, b, [x.abs() + 1 for x in b], -0.1),
    "lerp_": lambda a, b: torch._foreach_lerp_(a, b, 0.25),
    "sqrt_": lambda a, b: torch._foreach_sqrt_(torch._foreach_abs(a)) or None,
    "zero_": lambda a, b: torch._foreach_zero_(a),
    "copy_": lambda a, b: torch._foreach_copy_(a, b),
}


@pytest.mark.parametrize("name", INPLACE)
def test_foreach_inplace(name):
    torch.manual_seed(0)
    a, b = tensors((3,), (2, 2)), tensors((3,), (2, 2))
    ja, jb = to_jax((a, b))
    INPLACE[name](a, b)
    with torchlax_core.enable():
        INPLACE[name](ja, jb)
    assert_same(ja, a, atol=1e-6, rtol=1e-6)


OPTIMIZERS = {
    "sgd_momentum": lambda p, foreach: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=foreach
    ),
    "adam": lambda p, foreach: torch.optim.Adam(p, lr=0.01, foreach=foreach),
    "adam_amsgrad": lambda p, foreach: torch.optim.Adam(p, lr=0.01, amsgrad=True, foreach=foreach),
    "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=foreach),
}


@pytest.mark.parametrize("foreach", [None, True])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_steps_match_cpu(name, foreach):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with torchlax_core.enable():
        jax_model = copy.deepcopy(cpu_model).to("jax")
    cpu_opt = OPTIMIZERS[name](cpu_model.parameters(), foreach)
    jax_opt = OPTIMIZERS[name](jax_model.parameters(), foreach)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    for _ in range(3):
        cpu_opt.zero_grad()
        torch.nn.functional.mse_loss(cpu_model(x), y).backward()
        cpu_opt.step()
        with torchlax_core.enable():
            jax_opt.zero_grad()
            torch.nn.functional.mse_loss(jax_model(x.to("jax")), y.to("jax")).backward()
            jax_opt.step()
    for p, q in zip(cpu_model.parameters(), jax_model.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)
