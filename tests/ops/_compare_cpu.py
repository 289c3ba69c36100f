"""Run a torch function on CPU tensors and on torchlax Tensors (eagerly and in jax.jit); compare.

Shared by the nn, linalg, factory, random and foreach tests.
"""

from __future__ import annotations

import jax
import torch
import torchlax_core
from torch.utils import _pytree as pytree


def to_jax(tree):
    """CPU tensors in ``tree`` moved to the jax device (keeping requires_grad as a new leaf)."""

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        moved = x.detach().to("jax")
        return moved.requires_grad_(x.requires_grad)

    with torchlax_core.enable():
        return pytree.tree_map(move, tree)


def assert_same(actual, expected, *, atol=1e-5, rtol=1e-5, what="output"):
    """Same structure; each tensor has the same dtype, shape and (within tolerance) values."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: structure {a_spec} != {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        if not isinstance(e, torch.Tensor):
            assert a == e, f"{what}[{i}]: {a!r} != {e!r}"
            continue
        assert isinstance(a, torchlax_core.Tensor), f"{what}[{i}]: got {type(a).__name__}"
        assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{what}[{i}]: shape {tuple(a.shape)} != {tuple(e.shape)}"
        torch.testing.assert_close(
            a.detach().cpu(),
            e.detach(),
            atol=atol,
            rtol=rtol,
            equal_nan=True,
            msg=lambda m, i=i: f"{what}[{i}]: {m}",
        )


def run_jit(fn, *args):
    """``fn(*args)`` traced by jax.jit: tensor arguments are jit inputs, the rest static."""
    leaves, spec = pytree.tree_flatten(args)
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    structure = {}

    def program(*arrays):
        values = list(leaves)
        for i, a in zip(positions, arrays, strict=True):
            values[i] = torchlax_core.wrap(a)
        out = fn(*pytree.tree_unflatten(values, spec))
        out_leaves, structure["spec"] = pytree.tree_flatten(out)
        structure["leaves"] = out_leaves
        return [x.jax() for x in out_leaves if isinstance(x, torch.Tensor)]

    with torchlax_core.enable():
        arrays = iter(jax.jit(program)(*[leaves[i].jax() for i in positions]))
    out = [
        torchlax_core.wrap(next(arrays)) if isinstance(x, torch.Tensor) else x
        for x in structure["leaves"]
    ]
    return pytree.tree_unflatten(out, structure["spec"])


def check(fn, *args, atol=1e-5, rtol=1e-5, jit=True):
    """fn on torchlax Tensors (eager, and under jax.jit unless jit=False) matches fn on CPU."""
    expected = fn(*args)
    jax_args = to_jax(args)
    with torchlax_core.enable():
        actual = fn(*jax_args)
    assert_same(actual, expected, atol=atol, rtol=rtol, what="eager")
    if jit:
        assert_same(run_jit(fn, *to_jax(args)), expected, atol=atol, rtol=rtol, what="jit")
    return actual


def grads_match(loss_fn, inputs, *, atol=1e-5, rtol=1e-5):
    """loss_fn(*inputs).backward() gives the same gradients on torchlax as on CPU."""
    cpu = [
        x.detach().clone().requires_grad_(x.is_floating_point())
        if isinstance(x, torch.Tensor)
        else x
        for x in inputs
    ]
    jax_inputs = to_jax(cpu)
    loss_fn(*cpu).backward()
    with torchlax_core.enable():
        loss = loss_fn(*jax_inputs)
        loss.backward()
    for i, (j, c) in enumerate(zip(jax_inputs, cpu, strict=True)):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            if c.grad is None:  # not differentiated on the CPU either
                assert j.grad is None, f"input {i}: unexpected gradient"
                continue
            assert j.grad is not None, f"input {i}: no gradient"
            assert_same(j.grad, c.grad, atol=atol, rtol=rtol, what=f"grad[{i}]")


def stablehlo_with_grads(fn, arrays):
    """StableHLO of ``fn`` over torchlax Tensors and its gradients through PyTorch's autograd,
    traced as ``torchlax.jit`` traces a step."""
    import torchlax
    from torchlax_core.internal import tracing

    env = torchlax_core.default_env()

    def run(*arrays):
        with tracing(env):
            xs = [torchlax.torch_view(a).requires_grad_() for a in arrays]
            out = fn(*xs)
            grads = torch.autograd.grad(out.float().sum(), xs)
            return torchlax.jax_view((out, *grads))

    return jax.jit(run).lower(*arrays).as_text()
