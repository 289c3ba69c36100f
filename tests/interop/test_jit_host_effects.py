"""torchlax.jit and what a step does on the host, outside the traced program: backward hooks
that run in autograd's backward after a jitted forward, plain CPU tensors the step writes
into, and float64 cotangents of a backward that runs after the call.

Every case is compared with the same code run eagerly by PyTorch on the CPU (float64, 1e-10).
"""

import copy
import logging
import types
import warnings

import pytest
import torch
import torchlax
from torch import nn

pytestmark = pytest.mark.usefixtures("float64_default")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def _scale_grad_input(module, grad_input, grad_output):
    return tuple(None if g is None else g * 0.5 for g in grad_input)


def _full_backward_hook(model):
    return [model[2].register_full_backward_hook(_scale_grad_input)]


def _full_backward_pre_hook(model):
    return [model[2].register_full_backward_pre_hook(lambda m, grad_out: (grad_out[0] * 3,))]


def _non_full_backward_hook(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (deprecated, still PyTorch's API)
        return [model[2].register_backward_hook(_scale_grad_input)]


def _global_full_backward_hook(model):
    return [nn.modules.module.register_module_full_backward_hook(_scale_grad_input)]


class _TensorHook(nn.Module):
    """A forward that registers a hook on an intermediate tensor."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        h = self.inner[0](x)
        h.register_hook(lambda g: g * 10)
        return self.inner[2](self.inner[1](h))


HOOKS = {
    "full-backward-hook": _full_backward_hook,
    "full-backward-pre-hook": _full_backward_pre_hook,
    "non-full-backward-hook": _non_full_backward_hook,
    "global-full-backward-hook": _global_full_backward_hook,
    "tensor-hook-in-forward": None,
}


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", list(HOOKS))
def test_backward_hooks_run_when_backward_follows_a_jitted_forward(name):
    # The backward after a jitted forward is jax.vjp of the program, where no PyTorch hook
    # runs: such a call runs eagerly, and the gradients are eager PyTorch's.
    reference = _model()
    with torchlax.enable():
        model = copy.deepcopy(reference).to("jax")
    if HOOKS[name] is None:
        reference, model = _TensorHook(reference), _TensorHook(model)
        handles = []
    else:
        handles = HOOKS[name](reference) + HOOKS[name](model)
    try:
        jitted = torchlax.jit(model)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):  # the second call would save jax.vjp's residuals
            x = torch.randn(2, 4, generator=g)
            reference.zero_grad()
            model.zero_grad()
            (reference(x) ** 2).sum().backward()
            (jitted(torchlax.from_torch(x)) ** 2).sum().backward()
            for (key, r), p in zip(reference.named_parameters(), model.parameters(), strict=True):
                torch.testing.assert_close(p.grad.cpu(), r.grad, rtol=1e-10, atol=1e-10, msg=key)
        if HOOKS[name] is not None:
            # Without grad the forward is compiled (no hook runs eagerly either).
            before = jitted.compilations
            with torch.no_grad():
                out = jitted(torchlax.from_torch(x))
                torch.testing.assert_close(out.cpu(), reference(x), rtol=1e-10, atol=1e-10)
            assert jitted.compilations == before + 1
    finally:
        for h in handles:
            h.remove()


def test_the_log_line_of_a_forward_run_for_its_hooks_names_each_hook_in_words(caplog):
    # A global hook and a module's pre-hook, each named as what it is.
    with torchlax.enable():
        model = _model().to("jax")
    handles = _global_full_backward_hook(model) + _full_backward_pre_hook(model)
    try:
        with caplog.at_level(logging.INFO, logger="torchlax.jit"):
            torchlax.jit(model)(torchlax.from_torch(torch.randn(2, 4))).sum().backward()
    finally:
        for h in handles:
            h.remove()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "the forward meets the global full backward hook '_scale_grad_input'" in logged


def test_a_forward_run_eagerly_for_its_hooks_gets_its_static_arguments():
    # The eager call takes the call's own arguments, static ones included (the program's
    # configuration holds placeholders in their places).
    reference = _model()
    with torchlax.enable():
        model = copy.deepcopy(reference).to("jax")
    handles = _full_backward_hook(reference) + _full_backward_hook(model)
    try:
        jitted = torchlax.jit(lambda x, scale: model(x) * scale, static_argnums=1)
        x = torch.randn(2, 4)
        (reference(x) * 3.0).sum().backward()
        jitted(torchlax.from_torch(x), 3.0).sum().backward()
        for (key, r), p in zip(reference.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), r.grad, rtol=1e-10, atol=1e-10, msg=key)
    finally:
        for h in handles:
            h.remove()


def test_post_accumulate_grad_hook_runs_when_backward_follows_a_jitted_forward():
    # A parameter's post-accumulate hook runs in the backward outside the program, on the
    # parameter's own accumulation: it needs no eager call.
    reference = _model()
    with torchlax.enable():
        model = copy.deepcopy(reference).to("jax")
    calls = []

    def doubled(p):
        calls.append(p.shape)
        p.grad.mul_(2)

    for m in (reference, model):
        m[0].weight.register_post_accumulate_grad_hook(doubled)
    jitted = torchlax.jit(model)
    x = torch.randn(2, 4)
    for _ in range(2):
        reference.zero_grad()
        model.zero_grad()
        reference(x).sum().backward()
        jitted(torchlax.from_torch(x)).sum().backward()
        torch.testing.assert_close(
            model[0].weight.grad.cpu(), reference[0].weight.grad, rtol=1e-10, atol=1e-10
        )
    assert len(calls) == 4
    assert jitted.compilations >= 1


def test_float64_backward_after_a_jitted_forward_on_cpu_tensors():
    # backward() runs after the call, outside its JAX 64-bit mode: the float64 cotangents
    # (of the output used, and the zeros of the one that is not) stay float64.
    class TwoOutputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            y = self.lin(x)
            return y.sum(), y.tanh()

    torch.manual_seed(0)
    reference = TwoOutputs()
    model = copy.deepcopy(reference)
    jitted = torchlax.jit(model)
    x = torch.randn(2, 4)
    for _ in range(2):
        reference.zero_grad()
        model.zero_grad()
        want, _ = reference(x)
        got, _ = jitted(x)
        assert got.dtype == torch.float64
        want.backward()
        got.backward()
        for (key, r), p in zip(reference.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, r.grad, rtol=1e-10, atol=1e-10, msg=key)


# -- plain CPU tensors the step changes -----------------------------------------------------


def _add_(t, loss):
    t.add_(1)


def _iadd(t, loss):
    t += 1


def _setitem(t, loss):
    t[...] = 7


def _through_data(t, loss):
    t.data.add_(1)


def _data_replaced(t, loss):
    t.data = torch.full_like(t, 5)


def _copy_from_cpu(t, loss):
    t.copy_(torch.ones_like(t))


WRITES = {
    "add_": _add_,
    "iadd": _iadd,
    "setitem": _setitem,
    "through-data": _through_data,
    "data-replaced": _data_replaced,
    "copy_": _copy_from_cpu,
}


@pytest.mark.parametrize("trains", [True, False], ids=["step", "forward"])
@pytest.mark.parametrize("name", list(WRITES))
def test_a_cpu_tensor_the_step_changes_raises_and_is_left_as_it_was(name, trains):
    # On the host, once, while traced: it would not change on the program's calls.
    write = WRITES[name]
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1) if trains else None
    cfg = types.SimpleNamespace(count=torch.zeros(()))

    def step(x):
        if opt is not None:
            opt.zero_grad()
        loss = model(x).sum()
        write(cfg.count, loss)
        if opt is not None:
            loss.backward()
            opt.step()
        return loss

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    if trains:
        jitted(x)  # the first call runs eagerly (the optimizer creates its state)
    before = cfg.count
    value, storage = before.clone(), before.data_ptr()
    with pytest.raises(
        RuntimeError, match=r"writes into the CPU float64 tensor of shape \(\) at cfg\.count"
    ):
        jitted(x)
    assert cfg.count is before and cfg.count.data_ptr() == storage
    torch.testing.assert_close(cfg.count, value, rtol=0, atol=0)


def test_a_cpu_tensor_of_zeros_written_through_data_is_named_by_the_tensor_reached():
    # The change is seen on ``.data``'s alias and named by the tensor the step reached: one of
    # three zeros (whose truth value is ambiguous: it was asked for before).
    with torchlax.enable():
        model = _model().to("jax")
    cfg = types.SimpleNamespace(count=torch.zeros(3))

    def step(x):
        cfg.count.data.mul_(2)
        return model(x).sum()

    before = cfg.count
    with pytest.raises(
        RuntimeError, match=r"writes into the CPU float\d+ tensor of shape \(3,\) at cfg\.count"
    ):
        torchlax.jit(step)(torchlax.from_torch(torch.randn(2, 4)))
    assert cfg.count is before
    torch.testing.assert_close(cfg.count, torch.zeros(3), rtol=0, atol=0)


def test_a_cpu_tensor_given_a_grad_by_hand_raises():
    with torchlax.enable():
        model = _model().to("jax")
    w = torch.zeros(3)

    def fn(x):
        w.grad = torch.ones(3)
        return model(x)

    with pytest.raises(
        RuntimeError, match=r"gives a \.grad to the CPU float64 tensor of shape \(3,\) at w"
    ):
        torchlax.jit(fn)(torchlax.from_torch(torch.randn(2, 4)))
    assert w.grad is None


def test_cpu_tensors_the_step_makes_or_only_reads_are_fine():
    # A CPU tensor the step makes is its own (a value of the trace, as eagerly); one it only
    # reads is a constant of the program.
    with torchlax.enable():
        model = _model().to("jax")
    scale = torch.tensor(2.0)

    def fn(x):
        offset = torch.zeros(())
        offset.add_(3)
        return model(x) * scale + offset

    x = torch.randn(2, 4)
    reference = copy.deepcopy(model).cpu()
    torch.testing.assert_close(
        torchlax.jit(fn)(torchlax.from_torch(x)).cpu(),
        (reference(x) * scale + 3).detach(),
        rtol=1e-10,
        atol=1e-10,
    )
    assert scale.item() == 2.0


# -- .grads a backward() of the step gives to plain CPU tensors -------------------------------


def _host_loss(out, w):
    return out.sum() + (w * 2).sum().to(out.device)  # the loss a torchlax Tensor


def _host_only_loss(out, w):
    return (w * 2).sum()  # the whole loss on the host


@pytest.mark.parametrize(
    ("loss_of", "caught"),
    [(_host_loss, False), (_host_only_loss, False), (_host_loss, True)],
    ids=["jax-loss", "cpu-loss", "refusal-caught-by-the-step"],
)
def test_a_cpu_leaf_given_a_grad_by_backward_raises_and_is_left_as_it_was(loss_of, caught):
    # A backward() inside the step would give the CPU leaf its .grad once, on the host, while
    # traced (jax-loss: the gradient cannot even reach the host from the traced program;
    # cpu-loss: before, it silently accumulated into the existing .grad on each trace).
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = types.SimpleNamespace(w=torch.ones(3, requires_grad=True))

    def step(x):
        opt.zero_grad()
        loss = loss_of(model(x), cfg.w)
        try:
            loss.backward()
        except RuntimeError:
            if not caught:
                raise
        opt.step()
        return loss

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    jitted(x)  # the first call runs eagerly: w gets its .grad, as eagerly
    grad = cfg.w.grad
    assert grad is not None
    grad_value = grad.clone()
    with pytest.raises(
        RuntimeError,
        match=r"backward\(\) gives a \.grad to the CPU float64 tensor of shape \(3,\) at cfg\.w",
    ):
        jitted(x)
    assert cfg.w.grad is grad
    torch.testing.assert_close(grad, grad_value, rtol=0, atol=0)
    torch.testing.assert_close(cfg.w.detach(), torch.ones(3), rtol=0, atol=0)


def test_a_cpu_tensors_grad_written_in_place_raises_and_is_put_back():
    with torchlax.enable():
        model = _model().to("jax")
    w = torch.zeros(3)
    w.grad = torch.ones(3)
    grad = w.grad

    def fn(x):
        w.grad.mul_(2)
        return model(x)

    with pytest.raises(
        RuntimeError, match=r"gives a \.grad to the CPU float64 tensor of shape \(3,\) at w"
    ):
        torchlax.jit(fn)(torchlax.from_torch(torch.randn(2, 4)))
    assert w.grad is grad
    torch.testing.assert_close(grad, torch.ones(3), rtol=0, atol=0)


def test_a_cpu_module_trained_where_the_walk_does_not_reach_raises_naming_the_module():
    # Its parameters are CPU leaves of a backward() of the step: refused before it runs, and
    # named as the module they belong to.
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    holder = types.SimpleNamespace(nets=[[[types.SimpleNamespace(head=nn.Linear(3, 1))]]])

    def step(x):
        opt.zero_grad()
        head = holder.nets[0][0][0].head
        loss = model(x).sum() + head(torch.ones(2, 3)).sum().to("jax")
        loss.backward()
        opt.step()
        return loss

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    jitted(x)
    head = holder.nets[0][0][0].head
    grads = [p.grad for p in head.parameters()]
    with pytest.raises(RuntimeError, match=r"Linear at holder\.nets\[0\]\[0\]\[0\]\.head"):
        jitted(x)
    assert all(p.grad is g for p, g in zip(head.parameters(), grads, strict=True))


def test_a_tensor_argument_that_requires_grad_to_a_step_that_trains_raises():
    # Eagerly the step's backward() gives the argument a .grad; traced, an argument is a value
    # of the program that does not require grad (before: its .grad silently stayed as it was).
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = torch.ones(3, device="jax", requires_grad=True)

    def step(x, w):
        opt.zero_grad()
        loss = (model(x) * w).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    jitted(x, w)  # the first call runs eagerly: w gets its .grad, as eagerly
    grad = w.grad
    with pytest.raises(
        RuntimeError,
        match=r"tensor argument 1 \(the float64 tensor of shape \(3,\)\) requires grad",
    ):
        jitted(x, w)
    assert w.grad is grad
    # A step its shortcut repeats (the same call again) refuses such an argument too.
    v = w.detach().clone()
    for _ in range(3):
        jitted(x, v)
    v.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"tensor argument 1 .* requires grad"):
        jitted(x, v)
    assert v.grad is None


# -- gradients a step would carry from its traced program to plain CPU tensors ----------------


def _grad_toward_cpu_leaf(model, cfg, x):
    loss = model(x).sum() + (cfg.w * 2).sum().to("jax")
    (g,) = torch.autograd.grad(loss, [cfg.w], retain_graph=True)
    return loss, g


def _grad_toward_cpu_leaf_with_create_graph(model, cfg, x):
    loss = model(x).sum() + (cfg.w**2).sum().to("jax")
    (g,) = torch.autograd.grad(loss, cfg.w, create_graph=True)
    return loss, g


def _grad_toward_cpu_leaf_as_dict(model, cfg, x):
    loss = model(x).sum() + (cfg.w * 2).sum().to("jax")
    return loss, torch.autograd.grad(loss, {"w": cfg.w}, retain_graph=True)


def _grad_toward_cpu_leaf_the_step_makes(model, cfg, x):
    t = torch.ones(3, requires_grad=True)
    loss = model(x).sum() + (t * 2).sum().to("jax")
    (g,) = torch.autograd.grad(loss, t, retain_graph=True)
    return loss, g


def _grad_toward_cpu_intermediate(model, cfg, x):
    h = cfg.w * 2
    loss = model(x).sum() + h.sum().to("jax")
    (g,) = torch.autograd.grad(loss, [h], retain_graph=True)
    return loss, g


def _backward_to_cpu_leaf_the_step_makes(model, cfg, x):
    t = torch.ones(3, requires_grad=True)
    loss = model(x).sum() + (t * 2).sum().to("jax")
    loss.backward(retain_graph=True)
    return loss, t.grad


CROSSINGS = {
    "autograd.grad": (_grad_toward_cpu_leaf, r"torch\.autograd\.grad\(\) .* at cfg\.w"),
    "autograd.grad-create-graph": (
        _grad_toward_cpu_leaf_with_create_graph,
        r"torch\.autograd\.grad\(\) .* at cfg\.w",
    ),
    "autograd.grad-dict-inputs": (
        _grad_toward_cpu_leaf_as_dict,
        r"torch\.autograd\.grad\(\) .* at cfg\.w",
    ),
    "autograd.grad-made-leaf": (
        _grad_toward_cpu_leaf_the_step_makes,
        r"torch\.autograd\.grad\(\) .* \(3,\) that the step makes itself",
    ),
    "autograd.grad-intermediate": (
        _grad_toward_cpu_intermediate,
        r"torch\.autograd\.grad\(\) .* \(3,\) that the step makes itself",
    ),
    "backward-made-leaf": (
        _backward_to_cpu_leaf_the_step_makes,
        r"backward\(\) .* \(3,\) that the step makes itself",
    ),
}


@pytest.mark.parametrize("name", list(CROSSINGS))
def test_a_gradient_from_the_traced_program_to_a_cpu_tensor_raises_naming_it(name):
    # Eagerly PyTorch computes it on the CPU; traced, it would have to leave the program for
    # the host (before: an unnamed "Unable to cast" from the device copy's backward).
    gradient_of, names = CROSSINGS[name]
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = types.SimpleNamespace(w=torch.ones(3, requires_grad=True))

    def step(x):
        opt.zero_grad()
        loss, _ = gradient_of(model, cfg, x)
        loss.backward(inputs=list(model.parameters()))
        opt.step()
        return loss.detach()

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    jitted(x)  # the first call runs eagerly
    grad = cfg.w.grad
    with pytest.raises(
        RuntimeError,
        match=names + r".* would have to leave the compiled program .* Nothing was changed",
    ):
        jitted(x)
    assert cfg.w.grad is grad
    torch.testing.assert_close(cfg.w.detach(), torch.ones(3), rtol=0, atol=0)


def test_a_cpu_leafs_grad_read_after_a_refused_backward_raises_and_is_left_as_it_was():
    # The step catches the refusal and reads the leaf's .grad (the eager first call's): what
    # it reads is what was there, and the call still raises naming the leaf.
    with torchlax.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = types.SimpleNamespace(w=torch.ones(3, requires_grad=True))
    read = []

    def step(x):
        opt.zero_grad()
        loss = model(x).sum() + (cfg.w * 2).sum().to("jax")
        try:
            torch.autograd.backward(loss, inputs=[cfg.w, *model.parameters()])
        except RuntimeError:
            read.append(cfg.w.grad.clone())
        opt.step()
        return loss.detach()

    jitted = torchlax.jit(step)
    x = torchlax.from_torch(torch.randn(2, 4))
    jitted(x)  # the first call runs eagerly: w.grad is 2
    grad = cfg.w.grad
    with pytest.raises(
        RuntimeError,
        match=r"torch\.autograd\.backward\(\) gives a \.grad to the CPU float64 tensor of "
        r"shape \(3,\) at cfg\.w",
    ):
        jitted(x)
    torch.testing.assert_close(read[-1], torch.full((3,), 2.0), rtol=0, atol=0)
    assert cfg.w.grad is grad
    torch.testing.assert_close(grad, torch.full((3,), 2.0), rtol=0, atol=0)


def _run_against_eager(step_of, calls=3):
    """``step_of(model, opt)`` run eagerly on the CPU and under torchlax.jit on jax, ``calls``
    times each: the losses, extra results and final parameters are compared."""
    x = torch.randn(2, 4)
    reference = _model()
    reference_step = step_of(reference, torch.optim.SGD(reference.parameters(), lr=0.1))
    with torchlax.enable():
        model = _model().to("jax")
        jitted = torchlax.jit(step_of(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    xj = torchlax.from_torch(x)
    for _ in range(calls):
        want, got = reference_step(x), jitted(xj)
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)
    for p, q in zip(reference.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-10, atol=1e-10)


def test_autograd_grad_of_a_cpu_loss_toward_a_cpu_leaf_is_a_value_of_the_trace():
    # On the host alone the gradient is computed while traced, from constants: a constant of
    # the program, as eagerly (nothing is given a .grad).
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)

    def step_of(model, opt):
        def step(x):
            opt.zero_grad()
            (g,) = torch.autograd.grad((w**2).sum(), [w])
            loss = (model(x) * g.to(x.device)).sum()
            loss.backward()
            opt.step()
            return loss.detach(), g

        return step

    _run_against_eager(step_of)
    assert w.grad is None


def test_autograd_grad_with_create_graph_inside_a_step_matches_eager():
    # A gradient penalty: autograd.grad(create_graph=True) toward the parameters, then the
    # backward of the penalised loss, all traced.
    def step_of(model, opt):
        def step(x):
            opt.zero_grad()
            loss = model(x).pow(2).sum()
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grads)
            (loss + 0.01 * penalty).backward()
            opt.step()
            return loss.detach(), penalty.detach()

        return step

    _run_against_eager(step_of)


def test_autograd_grad_toward_a_closed_over_jax_leaf_matches_eager():
    # What the error above says to do: the leaf on 'jax', closed over (state), its gradient a
    # value of the program.
    def step_of(model, opt):
        device = next(model.parameters()).device
        w = torch.tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)

        def step(x):
            opt.zero_grad()
            loss = (model(x) * w).pow(2).sum()
            (g,) = torch.autograd.grad(loss, [w], retain_graph=True)
            loss.backward()
            opt.step()
            return loss.detach(), g, w.grad

        return step

    _run_against_eager(step_of)


class _ScaledBy(nn.Module):
    """A forward that reads a plain CPU tensor requiring grad, held as a plain attribute (a
    constant of the program, not state)."""

    def __init__(self, scale: torch.Tensor):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.scale = scale

    def forward(self, x):
        return self.lin(x) * self.scale.to(x.device)


@pytest.mark.parametrize("on", ["cpu", "jax"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trained-linear", "frozen-linear"])
def test_a_constant_requiring_grad_in_a_jitted_forward_gets_eager_gradients(frozen, on):
    # A tensor requiring grad held as a module's plain attribute is a constant of the program
    # (a plain CPU tensor, or a torchlax Tensor the state walk does not find), and jax.vjp of
    # the program gives a constant no gradient (before: its .grad silently stayed None, and
    # with the Linear frozen the output did not even require grad): such calls run eagerly,
    # calls without grad stay compiled.
    x = torch.randn(2, 4)
    reference = _ScaledBy(torch.tensor([1.0, -2.0, 3.0], requires_grad=True))
    with torchlax.enable():
        scale = torch.tensor([1.0, -2.0, 3.0], device=on, requires_grad=True)
        model = _ScaledBy(scale)
        model.lin.to("jax")
    for m in (reference, model):
        m.lin.requires_grad_(not frozen)
    jitted = torchlax.jit(model)
    xj = torchlax.from_torch(x)
    for _ in range(3):
        out = jitted(xj)
        want = reference(x)
        assert out.requires_grad == want.requires_grad
        (out**2).sum().backward()
        (want**2).sum().backward()
    torch.testing.assert_close(model.scale.grad.cpu(), reference.scale.grad, rtol=1e-10, atol=1e-10)
    if not frozen:
        torch.testing.assert_close(
            model.lin.weight.grad.cpu(), reference.lin.weight.grad, rtol=1e-10, atol=1e-10
        )
    with torch.no_grad():
        torch.testing.assert_close(jitted(xj).cpu(), reference(x), rtol=1e-10, atol=1e-10)
