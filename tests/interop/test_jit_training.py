"""torchlax.jit over a whole training step: forward, backward, optimizer, scheduler in one program.

Every case runs the same step eagerly in PyTorch on the CPU and compiled on torchlax, in
float64, and compares losses and final parameters to 1e-10.
"""

import copy
import dataclasses
import types
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
import torchlax
from torch import nn

STEPS = 5


pytestmark = pytest.mark.usefixtures("float64_default")


def _model(batchnorm=False):
    torch.manual_seed(0)
    layers = [nn.Linear(6, 8)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _data(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)
    ]


def _pair(make_opt, make_sched=None, batchnorm=False):
    """(reference model, optimizer, scheduler) on the CPU and the same on jax."""
    ref = _model(batchnorm)
    ref_opt = make_opt(ref.parameters())
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
        opt = make_opt(model.parameters())
    ref_sched = make_sched(ref_opt) if make_sched else None
    sched = make_sched(opt) if make_sched else None
    return (ref, ref_opt, ref_sched), (model, opt, sched)


def _step_fn(model, opt, sched, clip=None, micro_batches=1, zero_grad=True):
    def step(x, y):
        if zero_grad:
            opt.zero_grad()
        total = 0.0
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            loss = F.cross_entropy(model(xs), ys) / micro_batches
            loss.backward()
            total = total + loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        with torch.no_grad():
            accuracy = (model(x).argmax(-1) == y).double().mean()
        return total, accuracy

    return step


def _compare(make_opt, make_sched=None, **kwargs):
    (ref, ref_opt, ref_sched), (model, opt, sched) = _pair(
        make_opt, make_sched, batchnorm=kwargs.pop("batchnorm", False)
    )
    reference = _step_fn(ref, ref_opt, ref_sched, **kwargs)
    compiled = torchlax.jit(_step_fn(model, opt, sched, **kwargs))
    after_first = creates_state = None
    for x, y in _data():
        before = _state_names(ref_opt)
        want = reference(x, y)
        creates_state = _state_names(ref_opt) != before if creates_state is None else creates_state
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        after_first = compiled.compilations if after_first is None else after_first
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)
    for (name, w), g in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=name)
    # The first call compiles two programs (the step that creates the optimizer's state and
    # .grads, and the steady step, ahead); later calls compile nothing. A step whose first
    # call creates no optimizer state (plain SGD has none; Adagrad creates its own when it is
    # constructed) compiles one: the first call's program is the steady step's (the .grads
    # it left are discarded unread).
    programs = 2 if creates_state else 1
    assert after_first == programs
    assert compiled.compilations == programs
    return compiled, opt


def _state_names(opt) -> list:
    return [
        sorted(opt.state[p]) if p in opt.state else None
        for g in opt.param_groups
        for p in g["params"]
    ]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum-nesterov-wd": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01
    ),
    "sgd-momentum-dampening-loop": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, dampening=0.1, foreach=False
    ),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw-loop-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, foreach=False),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
    "rmsprop-loop": lambda p: torch.optim.RMSprop(p, lr=1e-2, foreach=False),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
    "adagrad-loop": lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=False),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step_matches_pytorch(name):
    _compare(OPTIMIZERS[name])


SCHEDULERS = {
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "lambda": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda epoch: 1 / (1 + epoch)),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_changes_the_rate_without_recompiling(name):
    compiled, opt = _compare(OPTIMIZERS["adamw"], SCHEDULERS[name])
    assert compiled.compilations == 2  # (both on the first call: _compare)
    assert opt.param_groups[0]["lr"] != 1e-2  # the scheduler ran, on the host, after each call


def test_clip_grad_norm_batchnorm_and_gradient_accumulation():
    _compare(OPTIMIZERS["sgd-momentum-nesterov-wd"], clip=0.5, micro_batches=2, batchnorm=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_learning_rate_is_passed_in_the_parameters_precision(dtype):
    # A Python-float rate meets float32 tensors as a float32 scalar in PyTorch; a float64 model
    # needs it in float64 to stay exact. Either way a changing rate compiles nothing.
    torch.set_default_dtype(dtype)  # the step counts' dtype (the fixture restores it)
    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)  # noqa: E731
    (ref, ref_opt, ref_sched), (model, opt, sched) = _pair(make_opt, SCHEDULERS["cosine"])
    reference = _step_fn(ref, ref_opt, ref_sched)
    compiled = torchlax.jit(_step_fn(model, opt, sched))
    tol = 1e-10 if dtype == torch.float64 else None  # None: float32's default tolerance
    for x, y in _data():
        x = x.to(dtype)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got[0].cpu(), want[0], rtol=tol, atol=tol)
    for (name, w), g in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g.cpu(), w, rtol=tol, atol=tol, msg=name)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead
    _, program = compiled.programs.values()  # the first call's, then the steady step's
    (entry,) = program.core._entries.values()
    n_state = len(entry.info.changed)  # the program's inputs: state arrays, then the rates
    assert entry.jaxpr.in_avals[n_state].dtype == torch.empty((), dtype=dtype).numpy().dtype


def test_learning_rate_set_by_hand_is_an_input():
    (_, _, _), (model, opt, _) = _pair(OPTIMIZERS["sgd"])
    step = torchlax.jit(_step_fn(model, opt, None))
    (x, y), *_ = _data(1)
    x, y = torchlax.from_torch(x), torchlax.from_torch(y)
    step(x, y)  # creates the state (and compiles the steady step ahead)
    before = model[0].weight.detach().cpu().clone()
    opt.param_groups[0]["lr"] = 0.0
    step(x, y)
    torch.testing.assert_close(model[0].weight.detach().cpu(), before)  # lr 0: no change
    opt.param_groups[0]["lr"] = 0.5
    step(x, y)
    assert not torch.equal(model[0].weight.detach().cpu(), before)
    assert step.compilations == 1  # plain SGD creates no state: the first call's is the steady


def test_dropout_gets_fresh_keys_each_step_and_follows_manual_seed():
    with torchlax.enable():
        model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), nn.Linear(16, 3)).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights never change

    @torchlax.jit
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    (x, y), *_ = _data(1)
    x, y = torchlax.from_torch(x), torchlax.from_torch(y)
    step(x, y)
    torch.manual_seed(3)
    a, b = step(x, y).item(), step(x, y).item()
    assert a != b
    torch.manual_seed(3)
    assert step(x, y).item() == a


def test_grads_and_state_are_written_back_as_tensors_of_the_objects():
    (_, _, _), (model, opt, _) = _pair(OPTIMIZERS["adam"])

    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    compiled = torchlax.jit(step)
    for x, y in _data(3):
        compiled(torchlax.from_torch(x), torchlax.from_torch(y))
    weight = model[0].weight
    state = opt.state[weight]
    assert isinstance(weight.grad, torchlax.Tensor) and weight.grad.shape == weight.shape
    assert int(state["step"].item()) == 3
    assert isinstance(state["exp_avg"], torchlax.Tensor)


def _append_layer(model, opt, on_jax):
    torch.manual_seed(5)
    layer = nn.Linear(3, 3)
    if on_jax:
        with torchlax.enable():
            layer = layer.to("jax")
    model.append(layer)
    return layer


def _replace_parameter(model, opt, on_jax):
    bias = torch.full((3,), 0.5)
    with torchlax.enable():
        model[2].bias = nn.Parameter(bias.to("jax") if on_jax else bias)


def _add_param_group(model, opt, on_jax):
    opt.add_param_group({"params": _append_layer(model, opt, on_jax).parameters(), "lr": 0.05})


def _grads_to_none(model, opt, on_jax):
    opt.zero_grad(set_to_none=True)


def _scale_in_place(model, opt, on_jax):
    with torch.no_grad():
        model[0].weight.mul_(0.5)


def _load_state_dict(model, opt, on_jax):
    model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})


def _freeze_first_layer(model, opt, on_jax):
    model[0].weight.requires_grad_(False)


def _replace_activation(model, opt, on_jax):
    model[1] = nn.Tanh()  # no parameters: only the module's class tells the programs apart


def _scale_first_layer_output(model, opt, on_jax):
    model[0].register_forward_hook(lambda module, args, output: output * 2)


def _halve_grad_into_last_layer(model, opt, on_jax):
    # A backward hook: PyTorch wraps the module's call in autograd functions for it
    model[2].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 0.5,))


CHANGES = {
    "new-submodule": (_append_layer, True),
    "parameter-replaced": (_replace_parameter, True),
    "add-param-group": (_add_param_group, True),
    # A step that accumulates (no zero_grad inside): the user clears the grads between calls.
    "zero-grad-set-to-none-between-steps": (_grads_to_none, False),
    # Values changed outside the step: the program reads them (no new layout, no new program).
    "in-place-outside-the-step": (_scale_in_place, True),
    "load-state-dict": (_load_state_dict, True),
    "requires-grad-turned-off": (_freeze_first_layer, True),
    "submodule-replaced-by-another-class": (_replace_activation, True),
    # A hook runs while the step is traced: one registered between steps is another program.
    "forward-hook-registered": (_scale_first_layer_output, True),
    "full-backward-hook-registered": (_halve_grad_into_last_layer, True),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_state_found_again_when_its_objects_change(name):
    # The state's layout is cached per function; a change of the objects that hold it makes
    # the next call find it again, and the results stay those of eager PyTorch.
    change, zero_grad = CHANGES[name]
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    reference = _step_fn(ref, ref_opt, None, zero_grad=zero_grad)
    compiled = torchlax.jit(_step_fn(model, opt, None, zero_grad=zero_grad))
    for i, (x, y) in enumerate(_data()):
        if i == 2:
            change(ref, ref_opt, on_jax=False)
            change(model, opt, on_jax=True)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=f"step {i}")
    assert ref.state_dict().keys() == model.state_dict().keys()
    for (key, w), g in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=key)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        assert (p.grad is None) == (p_ref.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-10, atol=1e-10)


@pytest.fixture
def repeated_steps(monkeypatch) -> list[bool]:
    """Per call that tried the repeated-step shortcut (interop jit/_repeated ``_StepPlan``):
    whether it took it (True) or left it for the general path."""
    from torchlax_interop.jit import _repeated

    taken: list[bool] = []
    original = _repeated._StepPlan.call

    def counted(self, jitted, args):
        out = original(self, jitted, args)
        taken.append(out is not _repeated._MISSED)
        return out

    monkeypatch.setattr(_repeated._StepPlan, "call", counted)
    return taken


def _replace_exp_avg(model, opt):
    # Another tensor object in the optimizer's state (the same kind of value: only its
    # identity tells the shortcut that the state to read is another one).
    state = opt.state[model[0].weight]
    with torch.no_grad():
        state["exp_avg"] = state["exp_avg"] * 0.5 + 0.25


def _replace_grad(model, opt):
    # A step without zero_grad reads the .grads it accumulates into: a .grad replaced by hand
    # is the one the next step adds to.
    weight = model[0].weight
    with torch.no_grad():
        weight.grad = weight.grad * 0.5 + 0.25


@pytest.mark.parametrize(
    "zero_grad, changes",
    [
        (True, {3: _replace_exp_avg}),
        (False, {3: _replace_grad}),
        (True, {3: _replace_grad}),  # (a .grad the step discards unread: set all the same)
        (True, {3: _replace_exp_avg, 4: _replace_grad}),
    ],
    ids=[
        "optimizer-state-value-replaced",
        "accumulated-grad-replaced",
        "discarded-grad-replaced",
        "state-then-grad-replaced",
    ],
)
def test_repeated_step_follows_what_its_shortcut_checks(zero_grad, changes, repeated_steps):
    # A training step that repeats the last call's program over the same state objects skips
    # assembling the state again (interop jit/_repeated ``_StepPlan``); a change between calls that
    # only the objects' identity shows must leave the shortcut, and the results stay eager's.
    make_opt = lambda p: torch.optim.AdamW(p, lr=0.1)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    reference = _step_fn(ref, ref_opt, None, zero_grad=zero_grad)
    compiled = torchlax.jit(_step_fn(model, opt, None, zero_grad=zero_grad))
    for i, (x, y) in enumerate(_data(6)):
        if i in changes:
            changes[i](ref, ref_opt)
            changes[i](model, opt)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=f"step {i}")
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), p_ref, rtol=1e-10, atol=1e-10)
        assert p.grad is not None
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-10, atol=1e-10)
        for name, value in ref_opt.state[p_ref].items():
            torch.testing.assert_close(opt.state[p][name].cpu(), value, rtol=1e-10, atol=1e-10)
    # Taken from the third call on (the first creates the state, the second records), left at
    # each change, taken again on the call after it.
    missed = [i for i, taken in enumerate(repeated_steps, start=2) if not taken]
    assert missed == list(changes), repeated_steps


@pytest.mark.parametrize("name", ["sgd-momentum-nesterov-wd", "adamw"])
def test_step_over_cpu_parameters_writes_into_the_same_tensors(name):
    torch.manual_seed(0)
    ref = _model()
    model = copy.deepcopy(ref)
    ref_opt, opt = OPTIMIZERS[name](ref.parameters()), OPTIMIZERS[name](model.parameters())
    reference = _step_fn(ref, ref_opt, None)
    compiled = torchlax.jit(_step_fn(model, opt, None))
    weight, version = model[0].weight, model[0].weight._version
    for x, y in _data():
        want = reference(x, y)
        got = compiled(x, y)
        for w, g in zip(want, got, strict=True):
            assert type(g) is torch.Tensor and g.device.type == "cpu"
            torch.testing.assert_close(g, w.detach(), rtol=1e-10, atol=1e-10)
    assert model[0].weight is weight and type(weight) is nn.Parameter
    assert weight._version >= version + STEPS  # written in place, as eager steps write
    for (key, w), g in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        assert type(g) is torch.Tensor
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=key)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-10, atol=1e-10)
        for (key, w), g in zip(ref_opt.state[p_ref].items(), opt.state[p].values(), strict=True):
            assert type(g) is torch.Tensor
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=key)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


def test_checked_mode_raises_pytorchs_error_after_the_call_and_keeps_the_state():
    env = torchlax.current_env()
    with torchlax.enable():
        emb = nn.Embedding(4, 3).to("jax")
    before = emb.weight.detach().cpu().clone()

    @torchlax.jit
    def lookup(ids):
        with torch.no_grad():
            emb.weight.add_(1.0)  # state the call changes (not written back when it fails)
        return emb(ids)

    ids = torchlax.from_torch(torch.tensor([0, 7]))
    env.config.checked = True
    try:
        with pytest.raises(IndexError, match="index out of range"):
            lookup(ids)
        torch.testing.assert_close(emb.weight.detach().cpu(), before)
        lookup(torchlax.from_torch(torch.tensor([0, 3])))
        torch.testing.assert_close(emb.weight.detach().cpu(), before + 1)
    finally:
        env.config.checked = False
    lookup(ids)  # unchecked: JAX's clamped read, no error


@pytest.mark.parametrize("zero_grad", [True, False])
def test_grads_the_step_discards_unread_are_not_program_inputs(zero_grad):
    # zero_grad() (set_to_none) first: the incoming .grads are dead, so they are not fed to
    # the program; a step that accumulates into them (no zero_grad) reads them.
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    reference = _step_fn(ref, ref_opt, None, zero_grad=zero_grad)
    compiled = torchlax.jit(_step_fn(model, opt, None, zero_grad=zero_grad))
    for x, y in _data(4):
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), p_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-10, atol=1e-10)
    # The first call's program (no .grads before it: none dead), then the steady step's
    assert list(compiled._dead_grads.values()) == [(), (0, 1, 2, 3) if zero_grad else ()]
    _, entry = [
        e for p in compiled.programs.values() for e in p.core._entries.values() if e._executable
    ]
    # 4 parameters + 4 momentum buffers (+ 4 live grads), the learning rate, x, y, the key
    assert len(entry.jaxpr.jaxpr.invars) == (12 if zero_grad else 16)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


def test_step_that_tests_its_grads_for_none_keeps_its_path_without_them():
    # The dead .grads are not None while tracing (a stand-in), so Python branching on them
    # takes the path it took when they were fed.
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)

    def step_fn(model, opt):
        def step(x, y):
            had_grads = sum(p.grad is not None for p in model.parameters())
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss * 0 + had_grads

        return step

    reference, compiled = step_fn(ref, ref_opt), torchlax.jit(step_fn(model, opt))
    for x, y in _data(3):
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)


# -- state reached through lists, tuples and dicts -------------------------------------------


def _holders(kind: str, model, opt, other_opt) -> dict:
    """What the step reads its model and optimizer from: ``opts[1]`` of a closed-over list,
    ``parts["opt"]`` of a dict, a tuple in a dict."""
    if kind == "list":
        return {"opts": [other_opt, opt], "model": model}
    if kind == "dict":
        return {"opts": {"sgd": other_opt, "main": opt}, "model": model}
    return {"opts": {"pair": (other_opt, opt)}, "model": {"net": (model,)}}


def _step_through(kind: str, holders: dict):
    opts, model = holders["opts"], holders["model"]

    def optimizer():
        if kind == "list":
            return opts[1]
        return opts["main"] if kind == "dict" else opts["pair"][1]

    def net(x):
        return model(x) if kind != "tuple" else model["net"][0](x)

    def step(x, y):
        optimizer().zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer().step()
        return loss

    return step


def _assert_same_parameters(ref, model):
    for (key, w), g in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10, msg=key)


@pytest.mark.parametrize("kind", ["list", "dict", "tuple"])
def test_optimizer_and_module_reached_through_containers_are_state(kind):
    # The optimizer (and, for "tuple", the module) is found inside the containers the
    # function closes over: its state is the program's input and output, as if closed over.
    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    ref_other = torch.optim.SGD(ref.parameters(), lr=0.1)
    with torchlax.enable():
        other = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = _step_through(kind, _holders(kind, ref, ref_opt, ref_other))
    compiled = torchlax.jit(_step_through(kind, _holders(kind, model, opt, other)))
    for x, y in _data(4):
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    _assert_same_parameters(ref, model)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


_GLOBAL_PARTS: dict = {}


def _global_step(x, y):
    # Reads its module and optimizer from a module-level dict (a global of the function).
    _GLOBAL_PARTS["opt"].zero_grad()
    loss = F.cross_entropy(_GLOBAL_PARTS["net"](x), y)
    loss.backward()
    _GLOBAL_PARTS["opt"].step()
    return loss


def test_module_in_a_global_dict_is_state():
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    compiled = torchlax.jit(_global_step)
    try:
        for x, y in _data(4):
            _GLOBAL_PARTS.update(net=ref, opt=ref_opt)
            want = _global_step(x, y)
            _GLOBAL_PARTS.update(net=model, opt=opt)
            got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
            torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    finally:
        _GLOBAL_PARTS.clear()
    _assert_same_parameters(ref, model)
    # Rebinding the dict's items for each call is followed: the state is found again (the
    # same objects each time: one program).
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


@pytest.mark.parametrize("change", ["rebind", "append"])
def test_container_changed_between_calls_is_followed(change):
    # opts[0] replaced by another optimizer, or a second model appended to the list the step
    # loops over: the next call walks again, and never runs the stale program.
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    (ref2, ref_opt2, _), (model2, opt2, _) = _pair(torch.optim.Adam)

    def step_fn(models: list, opts: list):
        def step(x, y):
            for o in opts:
                o.zero_grad()
            loss = sum(F.cross_entropy(m(x), y) for m in models)
            loss.backward()  # pyright: ignore[reportAttributeAccessIssue]  (a tensor sum)
            for o in opts:
                o.step()
            return loss

        return step

    ref_models: list[nn.Module] = [ref]
    models: list[nn.Module] = [model]
    ref_opts: list[torch.optim.Optimizer] = [ref_opt]
    opts: list[torch.optim.Optimizer] = [opt]
    reference, compiled = step_fn(ref_models, ref_opts), torchlax.jit(step_fn(models, opts))
    for i, (x, y) in enumerate(_data(3)):
        if i == 2 and change == "rebind":
            ref_opts[0] = torch.optim.Adam(ref.parameters(), lr=1e-2)
            with torchlax.enable():
                opts[0] = torch.optim.Adam(model.parameters(), lr=1e-2)
        if i == 2 and change == "append":
            ref_models.append(ref2)
            ref_opts.append(ref_opt2)
            models.append(model2)
            opts.append(opt2)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10, msg=f"step {i}")
    _assert_same_parameters(ref, model)
    _assert_same_parameters(ref2, model2)


@pytest.mark.parametrize("where", ["too-deep", "too-large"])
def test_optimizer_the_walk_does_not_reach_raises_naming_it(where):
    with torchlax.enable():
        model = _model().to("jax")
        adam = torch.optim.Adam(model.parameters())
    # deeper than the walk goes, or in a list longer than it reads
    nested = [[[[[adam]]]]] if where == "too-deep" else [None] * 64 + [adam]

    @torchlax.jit
    def step(x, y):
        opt = nested[0][0][0][0][0] if where == "too-deep" else nested[-1]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    x, y = _data(1)[0]
    with pytest.raises(RuntimeError, match=r"calls Adam.step\(\) on an optimizer that is not"):
        step(torchlax.from_torch(x), torchlax.from_torch(y))


class _Trainer:
    def __init__(self, model, opt):
        self.parts = {"net": model, "opts": [opt]}
        self.losses: list = []  # a history the loop appends to: no state

    def step(self, x, y):
        opt = self.parts["opts"][0]
        opt.zero_grad()
        loss = F.cross_entropy(self.parts["net"](x), y)
        loss.backward()
        opt.step()
        return loss


def test_bound_method_finds_state_in_its_objects_containers_not_its_tensor_history():
    # self.parts["net"] and self.parts["opts"][0] are state; the growing list of losses on
    # the same object is neither an input nor a reason to walk again (one program).
    make_opt = lambda p: torch.optim.Adam(p, lr=1e-2)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    reference, trainer = _Trainer(ref, ref_opt), _Trainer(model, opt)
    compiled = torchlax.jit(trainer.step)
    for x, y in _data(4):
        want = reference.step(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        trainer.losses.append(got.detach())
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    _assert_same_parameters(ref, model)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead
    assert compiled._layout is not None and not compiled._layout.tensors


# A module global that shares its name with an attribute the step below reads (``out.loss``),
# and that the step never reads itself: rebound by the test as a loop keeping its last loss.
loss = None


def test_a_global_named_like_an_attribute_the_step_reads_is_no_state():
    # ``out.loss`` puts the name "loss" in the step's code (an attribute), not a global read:
    # the walk took the global ``loss`` (a module here, then each call's result) as state,
    # and each call that rebound it walked again.
    global loss
    (ref, ref_opt, _), (model, opt, _) = _pair(lambda p: torch.optim.SGD(p, lr=0.1))

    def make_step(model, opt):
        def step(x, y):
            opt.zero_grad()
            out = types.SimpleNamespace(loss=F.cross_entropy(model(x), y))
            out.loss.backward()
            opt.step()
            return out.loss

        return step

    reference, compiled = make_step(ref, ref_opt), torchlax.jit(make_step(model, opt))
    with torchlax.enable():
        loss = nn.Linear(6, 6).to("jax")
    try:
        layouts = []
        for x, y in _data(4):
            want = reference(x, y)
            loss = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
            torch.testing.assert_close(loss.cpu(), want, rtol=1e-10, atol=1e-10)
            layouts.append(compiled._layout)
    finally:
        loss = None
    _assert_same_parameters(ref, model)
    assert layouts[0] is not None and layouts[0].modules == [model]
    assert not layouts[0].tensors and all(name != "loss" for _, name, _ in layouts[0].globals)
    assert layouts[1] is layouts[2] is layouts[3]


# -- state reached through other objects' attributes ------------------------------------------


@dataclasses.dataclass(slots=True)
class _Config:
    model: nn.Module
    depth: int = 2


class _Schedule(NamedTuple):
    scheduler: torch.optim.lr_scheduler.LRScheduler
    every: int


class _ObjectTrainer:
    """A trainer as people write one: its model in a (slotted) dataclass, its optimizer in a
    SimpleNamespace, its scheduler in a namedtuple there, and a history it appends to."""

    def __init__(self, model, opt, sched):
        self.cfg = _Config(model)
        self.parts = types.SimpleNamespace(opt=opt, schedule=_Schedule(sched, 1))
        self.history: list = []
        self.calls = 0

    def step(self, x, y):
        opt = self.parts.opt
        opt.zero_grad()
        loss = F.cross_entropy(self.cfg.model(x), y)
        loss.backward()
        opt.step()
        self.parts.schedule.scheduler.step()
        return loss


def _object_trainers(make_opt=None):
    make_opt = make_opt or (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    make_sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)  # noqa: E731
    (ref, ref_opt, ref_sched), (model, opt, sched) = _pair(make_opt, make_sched)
    return _ObjectTrainer(ref, ref_opt, ref_sched), _ObjectTrainer(model, opt, sched)


def test_state_in_a_bound_methods_objects_attributes_trains():
    # self.cfg.model, self.parts.opt and self.parts.schedule.scheduler are state (on main
    # they were constants: the step raised for the optimizer it did not find); the history
    # and the call count the loop updates are not re-checked (no walk, no new program).
    reference, trainer = _object_trainers()
    compiled = torchlax.jit(trainer.step)
    layouts = []
    for x, y in _data(4):
        want = reference.step(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
        trainer.history += [got.detach(), float(got.detach())]
        trainer.calls += 1
        layouts.append(compiled._layout)
    _assert_same_parameters(reference.cfg.model, trainer.cfg.model)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead
    assert layouts[1] is layouts[2] is layouts[3]


@dataclasses.dataclass
class _State:  # not hashable (eq=True): the program is keyed by the object's identity
    model: nn.Module
    opt: torch.optim.Optimizer


def _state_step(state, x, y):
    state.opt.zero_grad()
    loss = F.cross_entropy(state.model(x), y)
    loss.backward()
    state.opt.step()
    return loss


def test_state_in_an_argument_objects_attributes_trains():
    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1)  # noqa: E731
    (ref, ref_opt, _), (model, opt, _) = _pair(make_opt)
    reference, state = _State(ref, ref_opt), _State(model, opt)
    compiled = torchlax.jit(_state_step)
    for x, y in _data(4):
        want = _state_step(reference, x, y)
        got = compiled(state, torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    _assert_same_parameters(ref, model)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


def _rebind_model(trainer, make_model):
    trainer.cfg.model = make_model()  # a fresh model the optimizer does not update


def _rebind_parts(trainer, make_model):
    opt = torch.optim.Adam(trainer.cfg.model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer.parts = types.SimpleNamespace(opt=opt, schedule=_Schedule(sched, 1))


def test_attributes_rebound_between_calls_are_followed():
    # trainer.cfg.model rebound before the third call, trainer.parts before the fourth: each
    # call runs on the objects the trainer holds then, never a stale program or weights.
    reference, trainer = _object_trainers()
    compiled = torchlax.jit(trainer.step)
    rebinds = {2: _rebind_model, 3: _rebind_parts}
    for i, (x, y) in enumerate(_data(5)):
        if i in rebinds:
            rebinds[i](reference, _model)
            with torchlax.enable():
                rebinds[i](trainer, lambda: _model().to("jax"))
        want = reference.step(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10, msg=f"step {i}")
    _assert_same_parameters(reference.cfg.model, trainer.cfg.model)
    for ref_p, p in zip(reference.cfg.model.parameters(), trainer.cfg.model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), ref_p.grad, rtol=1e-10, atol=1e-10)


class _SelfTrainingNet(nn.Module):
    """A module that holds its optimizer as a plain attribute and trains itself."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self.optimizer = torch.optim.RMSprop(net.parameters(), lr=1e-2)
        self.seen = 0  # a count the loop updates: not re-checked

    def training_step(self, x, y):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.net(x), y)
        loss.backward()
        self.optimizer.step()
        return loss


def test_a_modules_own_method_finds_the_optimizer_it_holds():
    ref = _SelfTrainingNet(_model())
    with torchlax.enable():
        trainer = _SelfTrainingNet(copy.deepcopy(_model()).to("jax"))
    compiled = torchlax.jit(trainer.training_step)
    for x, y in _data(4):
        want = ref.training_step(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        trainer.seen += 1
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    _assert_same_parameters(ref, trainer)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


def test_module_trained_where_the_walk_does_not_reach_raises_naming_its_path():
    # Deeper than the walk goes, and updated by hand (no optimizer to trip on): its
    # parameters would be constants of the program, and the step would not train them.
    with torchlax.enable():
        model = _model().to("jax")
    holder = types.SimpleNamespace(nets=[[[types.SimpleNamespace(model=model)]]])

    @torchlax.jit
    def step(x, y):
        net = holder.nets[0][0][0].model
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
        return loss

    x, y = _data(1)[0]
    with pytest.raises(RuntimeError, match=r"Sequential at holder\.nets\[0\]\[0\]\[0\]\.model"):
        step(torchlax.from_torch(x), torchlax.from_torch(y))
    # and the parameters' .grads are left as they were (no tracer of the refused trace)
    assert all(p.grad is None for p in model.parameters())


# -- tensors that are no state: constants of the program -------------------------------------
# A tensor the state walk does not find is a constant of the program. Reading one is fine; a
# step that changes one (an in-place write, ``.data -=``, ``copy_``, or a ``.grad`` its
# ``backward()`` gives it) raises at its first compiled call, naming the tensor and where the
# function reaches it, and leaves the tensor as it was (before, the tensor silently kept a
# trace-time value, or held a tracer that failed later, far away).


def _const_data():
    return _data(1)[0]


def _linear():
    torch.manual_seed(0)
    return nn.Linear(6, 3)


def _hand_update(model):
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None


def _grad_through_object(model, w):
    cfg = types.SimpleNamespace(w=w)  # a plain object's tensor: no state

    def step(x, y):
        loss = F.cross_entropy(F.linear(model(x), cfg.w), y)
        loss.backward()
        _hand_update(model)
        return loss

    return step, r"gives a \.grad to the float64 tensor of shape \(3, 3\) at cfg\.w"


def _grad_through_a_modules_object(model, w):
    model.extra = types.SimpleNamespace(w=w)  # an object a module holds: not entered

    def step(x, y):
        loss = F.cross_entropy(F.linear(model(x), model.extra.w), y)
        loss.backward()
        _hand_update(model)
        return loss

    return step, r"gives a \.grad to the float64 tensor of shape \(3, 3\) at model\.extra\.w"


def _written_in_place(model, buf):
    cfg = types.SimpleNamespace(seen=buf)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        cfg.seen.add_(1)
        return loss

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.seen"


def _written_and_returned(model, buf):
    cfg = types.SimpleNamespace(seen=buf)

    def step(x, y):
        return F.cross_entropy(model(x), y), cfg.seen.add_(1)

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.seen"


def _written_through_data(model, w):
    cfg = types.SimpleNamespace(w=w)

    def step(x, y):
        loss = F.cross_entropy(F.linear(model(x), cfg.w), y)
        loss.backward()
        cfg.w.data -= 0.1 * cfg.w.grad  # (its .grad is given too: the write is named)
        return loss

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.w"


def _rebound_through_data(model, w):
    cfg = types.SimpleNamespace(w=w)

    def step(x, y):
        loss = F.cross_entropy(F.linear(model(x), cfg.w), y)
        cfg.w.data = cfg.w.data * 0.5  # (other memory: its storage is put back)
        return loss

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.w"


def _written_by_a_helper(model, buf):
    def count():  # a callback an object keeps (the walk does not follow those), closing
        buf.add_(1)  # over the tensor

    cfg = types.SimpleNamespace(count=count)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        cfg.count()
        return loss

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.count -> buf"


def _copied_into(model, ema):
    cfg = types.SimpleNamespace(ema=ema)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        with torch.no_grad():
            cfg.ema.copy_(0.9 * cfg.ema + 0.1 * model.weight[:, :3])
        return loss

    return step, r"writes into the float64 tensor of shape \(3, 3\) at cfg\.ema"


CONSTANT_CHANGES = {
    "grad-through-object": (_grad_through_object, True),
    "grad-through-a-modules-object": (_grad_through_a_modules_object, True),
    "add_": (_written_in_place, False),
    "add_-returned": (_written_and_returned, False),
    "data-sub": (_written_through_data, True),
    "data-rebind": (_rebound_through_data, False),
    "copy_": (_copied_into, False),
    "helper": (_written_by_a_helper, False),
}


@pytest.mark.parametrize("case", list(CONSTANT_CHANGES))
def test_step_changing_a_tensor_that_is_no_state_raises_naming_it(case):
    make, requires_grad = CONSTANT_CHANGES[case]
    with torchlax.enable():
        model = _linear().to("jax")
        t = torch.randn(3, 3, device="jax", requires_grad=requires_grad)
        grad = torch.ones(3, 3, device="jax") if requires_grad else None
    t.grad = grad
    before = t.detach().cpu().clone()
    step, named = make(model, t)
    x, y = _const_data()
    with pytest.raises(RuntimeError, match=named) as error:
        torchlax.jit(step)(torchlax.from_torch(x), torchlax.from_torch(y))
    assert "Pass the tensor as an argument" in str(error.value)
    # The tensor holds what it held before the call: its value and its .grad, readable.
    torch.testing.assert_close(t.detach().cpu(), before, rtol=0, atol=0)
    assert t.grad is grad
    if grad is not None:
        torch.testing.assert_close(grad.cpu(), torch.ones(3, 3), rtol=0, atol=0)
    # and the model's parameters too: the error came before the program ran
    torch.testing.assert_close(model.weight.cpu(), _linear().weight, rtol=0, atol=0)


def test_tensor_given_to_the_optimizer_is_state_and_trains():
    # cfg.w is reached through a plain object (no state there), but the optimizer the step
    # closes over holds it: its parameters are state, so it trains as eagerly.
    def make():
        model = _linear()
        torch.manual_seed(1)
        cfg = types.SimpleNamespace(w=torch.randn(3, 3, requires_grad=True))
        return model, cfg

    def step_of(model, cfg, opt):
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(F.linear(model(x), cfg.w), y)
            loss.backward()
            opt.step()
            return loss

        return step

    ref_model, ref_cfg = make()
    ref = step_of(ref_model, ref_cfg, torch.optim.SGD([*ref_model.parameters(), ref_cfg.w], 0.1))
    model, cfg = make()
    with torchlax.enable():
        model.to("jax")
        cfg.w = cfg.w.detach().to("jax").requires_grad_()
        opt = torch.optim.SGD([*model.parameters(), cfg.w], lr=0.1, momentum=0.0)
    compiled = torchlax.jit(step_of(model, cfg, opt))
    x, y = _const_data()
    for _ in range(3):
        want = ref(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cfg.w.detach().cpu(), ref_cfg.w.detach(), rtol=1e-10, atol=1e-10)


def test_step_reading_a_tensor_that_is_no_state_and_making_its_own_runs():
    # A constant read (a mask on a plain object), and tensors the step makes from host data
    # and changes (a count, a returned accumulator): none is a constant the step changes.
    with torchlax.enable():
        model = _linear().to("jax")
        cfg = types.SimpleNamespace(mask=torch.tensor([1.0, 0.0, 1.0], device="jax"))

    def step(x):
        acc = torch.tensor([0.0, 0.0, 0.0], device="jax")
        acc += (model(x) * cfg.mask).sum(0)
        local = torch.tensor(2.0, device="jax")
        local.mul_(acc.sum())
        return acc, local

    x, _ = _const_data()
    with torch.no_grad():
        acc, local = torchlax.jit(step)(torchlax.from_torch(x))
        expected = (model(torchlax.from_torch(x)) * cfg.mask).sum(0)
    torch.testing.assert_close(acc.cpu(), expected.cpu())
    torch.testing.assert_close(local.cpu(), 2 * expected.sum().cpu())
    torch.testing.assert_close(cfg.mask.cpu(), torch.tensor([1.0, 0.0, 1.0]))


def test_tensor_the_step_makes_changes_and_saves_for_backward_is_its_own():
    # m is made from host data and changed in place, then saved by the autograd graph of the
    # output (so alive after the trace): the step's own tensor, no constant it changes.
    # (float32: a float64 output's backward across a jitted call gets a float32 cotangent)
    with torchlax.enable():
        w = torch.randn(3, device="jax", dtype=torch.float32, requires_grad=True)

    def f(x):
        m = torch.tensor([1.0, 2.0, 3.0], device="jax", dtype=torch.float32)
        m += x
        return (m * w).sum()

    out = torchlax.jit(f)(torchlax.from_torch(torch.ones(3, dtype=torch.float32)))
    out.backward()
    assert w.grad is not None
    torch.testing.assert_close(w.grad.cpu(), torch.tensor([2.0, 3.0, 4.0], dtype=torch.float32))


@pytest.mark.parametrize("change", ["in-place", "through-data"])
def test_constant_the_user_changes_between_calls_is_seen(change):
    # A mask on a plain object is a constant of the program; the user changing it between
    # calls (in place, or giving it other memory) makes the next call trace and compile the
    # step again, so it computes what eager PyTorch computes.
    def make():
        model = _linear()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, opt, types.SimpleNamespace(mask=torch.ones(3))

    def step_of(model, opt, cfg):
        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x) * cfg.mask, y)
            loss.backward()
            opt.step()
            return loss

        return step

    def change_mask(cfg, device):
        if change == "in-place":
            cfg.mask[1] = 0.0
        else:
            cfg.mask.data = torch.tensor([0.0, 1.0, 0.5], device=device)

    ref_model, ref_opt, ref_cfg = make()
    reference = step_of(ref_model, ref_opt, ref_cfg)
    model, opt, cfg = make()
    with torchlax.enable():
        model.to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        cfg.mask = cfg.mask.to("jax")
    compiled = torchlax.jit(step_of(model, opt, cfg))
    x, y = _const_data()
    for i in range(5):
        if i == 3:
            change_mask(ref_cfg, "cpu")
            with torchlax.enable():
                change_mask(cfg, "jax")
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10, msg=f"step {i}")
    _assert_same_parameters(ref_model, model)
    # (the first call's program and the steady one, ahead; one more for the new mask)
    assert compiled.compilations == 3  # pyright: ignore[reportFunctionMemberAccess]


def test_constant_changed_between_repeated_forwards_is_seen():
    # The repeated-forward shortcut checks the constants too.
    with torchlax.enable():
        cfg = types.SimpleNamespace(scale=torch.full((3,), 2.0, device="jax"))
    forward = torchlax.jit(lambda x: x * cfg.scale)
    x = torchlax.from_torch(torch.arange(3.0))
    with torch.no_grad():
        assert forward(x).cpu().tolist() == [0.0, 2.0, 4.0]
        assert forward(x).cpu().tolist() == [0.0, 2.0, 4.0]  # (the shortcut records it)
        cfg.scale.fill_(3.0)
        assert forward(x).cpu().tolist() == [0.0, 3.0, 6.0]


def test_constants_in_a_list_or_keyword_argument_are_checked_on_each_call():
    # A constant is seen wherever a torch call takes it: inside a list argument, or as a
    # keyword argument; changed between calls, the next call traces the step again.
    with torchlax.enable():
        cfg = types.SimpleNamespace(
            pad=torch.full((2,), 5.0, device="jax"), bias=torch.ones(4, device="jax")
        )

    def f(x):
        return torch.add(torch.cat([x, cfg.pad]), other=cfg.bias)

    forward = torchlax.jit(f)
    x = torchlax.from_torch(torch.arange(2.0))
    with torch.no_grad():
        assert forward(x).cpu().tolist() == [1.0, 2.0, 6.0, 6.0]
        cfg.pad.fill_(7.0)
        assert forward(x).cpu().tolist() == [1.0, 2.0, 8.0, 8.0]
        cfg.bias.data = torch.full((4,), 2.0, device="jax")
        assert forward(x).cpu().tolist() == [2.0, 3.0, 9.0, 9.0]


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_tensor_learning_rate_changed_by_a_scheduler_is_an_input(device):
    # SGD(lr=torch.tensor(...)): StepLR changes the tensor in place (fill_) after each call.
    # Baked in, a CPU rate kept its first value silently, a jax one compiled once per step.
    def make_opt(params):
        params = list(params)
        lr = torch.tensor(0.1, device=params[0].device if device == "jax" else "cpu")
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    _compare(make_opt, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))


def test_the_first_call_compiles_no_op_executables():
    """The first call creates the optimizer's state in its own program: ops its trace runs
    on concrete values are not compiled into op executables used once. Eager code after it
    compiles as usual, and the step still matches PyTorch."""
    env = torchlax.Environment()
    env.config.op_cache_size, env.config.op_cache_min_calls = 4096, 2
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    with torchlax.enable(env):
        model = copy.deepcopy(ref).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        compiled = torchlax.jit(_step_fn(model, opt, None))
        (x, y), *rest = _data(3)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        assert env.stats()["op_cache_size"] == 0
        for xs, ys in rest:
            got = compiled(torchlax.from_torch(xs), torchlax.from_torch(ys))
        h = torchlax.from_torch(torch.randn(4, 6))
        for _ in range(2):  # plain, then compiled: the suspension ended with the first call
            torch.tanh(h)
        assert env.stats()["op_cache_size"] == 1
    reference = _step_fn(ref, ref_opt, None)
    for xs, ys in _data(3):
        want = reference(xs, ys)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


@pytest.mark.parametrize("held", ["closure", "default-argument"])
def test_a_closed_over_leaf_that_is_no_parameter_gets_its_grad_as_eagerly(held):
    # A torchlax Tensor the step closes over (or holds as a default argument, the same to the
    # walk) is state; one that requires grad is a leaf whose .grad the step's backward()
    # accumulates (no optimizer zeroes it): its .grad is state too. (Before, the trace left a
    # tracer in its .grad and the next trace failed with "reads 1 value(s) computed inside an
    # earlier trace"; a default argument's tensor was refused as no state.)
    def make(device):
        torch.manual_seed(0)
        with torchlax.enable():
            model = _model().to(device)
            w = torch.ones(3, device=device, requires_grad=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x) * w, y)
            loss.backward()
            opt.step()
            return loss.detach()

        def step_with_default(x, y, w=w):
            opt.zero_grad()
            loss = F.cross_entropy(model(x) * w, y)
            loss.backward()
            opt.step()
            return loss.detach()

        return (step if held == "closure" else step_with_default), model, w

    ref_step, ref, ref_w = make("cpu")
    step, model, w = make("jax")
    compiled = torchlax.jit(step)
    for x, y in _data(3):
        want = ref_step(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(w.grad.cpu(), ref_w.grad, rtol=1e-10, atol=1e-10)
    _assert_same_parameters(ref, model)
    assert compiled.compilations == 2  # the first call's program and the steady one, ahead


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.Rprop])
def test_the_optimizers_capturable_flag_is_left_as_it_was(optimizer):
    """The trace (Adam) and the eager first call (Rprop reads a value on the host) run the
    optimizer's capturable code path, and put each group's flag back after the call."""
    torch.manual_seed(0)
    with torchlax.enable():
        model = nn.Linear(4, 2).to("jax")
        opt = optimizer(model.parameters(), lr=0.01)
        x = torch.randn(3, 4).to("jax")

    def step(x):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()

    jstep = torchlax.jit(step)
    for _ in range(3):
        jstep(x)
        assert opt.param_groups[0]["capturable"] is False


def test_a_refused_trace_leaves_the_optimizer_as_it_found_it():
    """A trace refused after it swapped its stand-ins in (the step assigns a learning rate)
    puts back each group's learning rate and ``capturable`` flag, the state entries and the
    ``.grad``s (the same state entries; the same values: a ``.grad`` that is a view is
    replaced by its own value as the call assembles its state)."""
    torch.manual_seed(0)
    with torchlax.enable():
        model = nn.Linear(4, 2).to("jax")
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        x = torch.randn(3, 4).to("jax")

    def step(x):
        opt.param_groups[0]["lr"] = 0.5  # (refused in a trace: the first call runs eagerly)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()

    jstep = torchlax.jit(step)
    jstep(x)  # (eagerly: creates the optimizer's state, sets the rate)
    group = opt.param_groups[0]
    group["lr"] = 0.25  # (by hand: what the refused trace's assignment must not leave)
    entries = {p: dict(opt.state[p]) for p in model.parameters()}
    values = [(p.detach().cpu(), p.grad.cpu()) for p in model.parameters()]
    with pytest.raises(torchlax.JitError, match=r"param_group\['lr'\]"):
        jstep(x)
    assert group["lr"] == 0.25 and type(group["lr"]) is float
    assert group["capturable"] is False
    for p, (value, grad_value) in zip(model.parameters(), values, strict=True):
        assert opt.state[p].keys() == entries[p].keys()
        assert all(opt.state[p][k] is v for k, v in entries[p].items())
        torch.testing.assert_close(p.detach().cpu(), value, rtol=0, atol=0)
        torch.testing.assert_close(p.grad.cpu(), grad_value, rtol=0, atol=0)
