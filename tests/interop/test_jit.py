"""jit: PyTorch functions and modules compiled with jax.jit."""

import copy

import jax
import pytest
import torch
import torchlax_core
from torchlax_interop import from_torch, jit


def _jax(t: torch.Tensor) -> torchlax_core.Tensor:
    return from_torch(t)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


def test_function_matches_eager_and_returns_torchlax_tensors():
    def fn(x, y, *, power):
        return {"out": torch.tanh(x @ y) ** power, "shape": x.shape[0]}

    x, y = torch.randn(3, 4), torch.randn(4, 5)
    out = jit(fn)(_jax(x), _jax(y), power=2)
    assert isinstance(out["out"], torchlax_core.Tensor) and out["shape"] == 3
    torch.testing.assert_close(_cpu(out["out"]), fn(x, y, power=2)["out"])


def test_cpu_tensors_in_cpu_tensors_out():
    fn = jit(lambda x: torch.sin(x) * 2)
    x = torch.randn(5)
    out = fn(x)
    assert type(out) is torch.Tensor and out.device.type == "cpu"
    torch.testing.assert_close(out, torch.sin(x) * 2)


def test_int64_stays_int64():
    out = jit(lambda i: i * 3 + 1)(_jax(torch.arange(4)))
    assert out.dtype == torch.int64
    assert torch.equal(_cpu(out), torch.arange(4) * 3 + 1)


def test_new_shapes_and_static_values_compile_new_programs_weights_do_not():
    traces = []

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x):
            traces.append(tuple(x.shape))
            return self.linear(x)

    module = Counting()
    jitted = jit(module)
    x = torch.randn(4, 3)
    first = jitted(_jax(x))
    count = len(traces)
    with torch.no_grad():
        module.linear.weight.mul_(2)  # a CPU module: its weights are inputs each call
    second = jitted(_jax(x))
    assert len(traces) == count  # updated weights: no retrace
    torch.testing.assert_close(_cpu(second), module(x).detach())
    assert not torch.allclose(_cpu(first), _cpu(second))
    jitted(_jax(torch.randn(7, 3)))
    assert traces[-1] == (7, 3)  # a new shape: a new trace


def test_closure_rebound_to_another_module_is_followed():
    cpu_first, cpu_second = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torchlax_core.enable():
        first, second = copy.deepcopy(cpu_first).to("jax"), copy.deepcopy(cpu_second).to("jax")
    model = first

    def forward(x):
        return model(x)

    jitted = jit(forward)
    x = torch.randn(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(_cpu(jitted(_jax(x))), cpu_first(x))
        model = second  # the closure cell now names another module: its weights are the state
        torch.testing.assert_close(_cpu(jitted(_jax(x))), cpu_second(x))
        second.weight.mul_(2)  # new values in the same objects: no new walk needed to see them
        cpu_second.weight.mul_(2)
        torch.testing.assert_close(_cpu(jitted(_jax(x))), cpu_second(x))
    assert jitted.compilations == 1


def test_static_argnums():
    def fn(x, axis):
        return x.sum(axis)

    jitted = jit(fn, static_argnums=1)
    x = torch.randn(3, 4)
    torch.testing.assert_close(_cpu(jitted(_jax(x), 0)), x.sum(0))
    torch.testing.assert_close(_cpu(jitted(_jax(x), 1)), x.sum(1))


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 2)
    )


def test_batchnorm_buffers_are_written_back():
    reference = _net()
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    for _ in range(3):
        x = torch.randn(8, 3)
        out = jitted(_jax(x))
        want = reference(x)
        torch.testing.assert_close(_cpu(out), want.detach(), rtol=1e-4, atol=1e-5)
    bn, ref_bn = model[1], reference[1]
    torch.testing.assert_close(_cpu(bn.running_mean), ref_bn.running_mean)
    torch.testing.assert_close(_cpu(bn.running_var), ref_bn.running_var)
    assert int(bn.num_batches_tracked.item()) == 3
    model.eval()
    reference.eval()
    x = torch.randn(5, 3)
    torch.testing.assert_close(_cpu(jitted(_jax(x))), reference(x).detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "autograd"])
def test_an_interrupted_forward_writes_its_buffers_whole(monkeypatch, grad):
    """A forward's buffers (BatchNorm's running statistics) are written back all or nothing,
    autograd's forward too (it runs its plan's write-back): an interrupt arriving as the
    write-back starts is raised once it is done."""
    from torchlax_interop.jit import _repeated

    reference = _net(2)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x = torch.randn(8, 3)
    write_changed, interrupted = _repeated._write_changed, []

    def interrupting(*args):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return write_changed(*args)

    monkeypatch.setattr(_repeated, "_write_changed", interrupting)
    with pytest.raises(KeyboardInterrupt), torch.set_grad_enabled(grad):
        jitted(_jax(x).requires_grad_(grad))
    monkeypatch.undo()
    assert interrupted
    reference(x)
    torch.testing.assert_close(_cpu(model[1].running_mean), reference[1].running_mean)
    torch.testing.assert_close(_cpu(model[1].running_var), reference[1].running_var)


def test_backward_matches_torch():
    reference = _net(1)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x = torch.randn(8, 3)
    xj = _jax(x).requires_grad_()
    out = jitted(xj)
    loss = (out * out).mean()
    loss.backward()
    x_ref = x.clone().requires_grad_()
    ref_loss = (reference(x_ref) ** 2).mean()
    ref_loss.backward()
    torch.testing.assert_close(_cpu(loss), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_cpu(xj.grad), x_ref.grad, rtol=1e-4, atol=1e-6)
    for (name, p), (_, r) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(_cpu(p.grad), r.grad, rtol=1e-4, atol=1e-6, msg=name)
    # buffers were written back on the differentiable path too
    torch.testing.assert_close(_cpu(model[1].running_mean), reference[1].running_mean)


def test_trains_with_an_optimizer():
    reference = _net(2)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    jitted = jit(model)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    for _ in range(3):
        opt.zero_grad()
        ((jitted(_jax(x)) - _jax(y)) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((reference(x) - y) ** 2).mean().backward()
        ref_opt.step()
    for p, r in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(_cpu(p), r.detach(), rtol=1e-4, atol=1e-5)
    assert len(jitted.programs) == 1


def test_dropout_differs_per_call_and_follows_manual_seed():
    model = torch.nn.Dropout(0.5)
    jitted = jit(model)
    x = _jax(torch.ones(64))
    torch.manual_seed(0)
    a, b = _cpu(jitted(x)), _cpu(jitted(x))
    assert not torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(0)
    assert torch.equal(_cpu(jitted(x)), a)
    model.eval()
    assert torch.equal(_cpu(jitted(x)), torch.ones(64))


def test_deterministic_program_leaves_torch_rng_alone():
    jitted = jit(lambda x: x + 1)
    x = _jax(torch.ones(3))
    jitted(x)
    torch.manual_seed(0)
    jitted(x)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(1), after)


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_cpu_and_jax_modules(device):
    reference = torch.nn.Linear(3, 2)
    model = copy.deepcopy(reference)
    if device == "jax":
        with torchlax_core.enable():
            model = model.to("jax")
    x = torch.randn(4, 3)
    out = jit(model)(x if device == "cpu" else _jax(x))
    torch.testing.assert_close(_cpu(out), reference(x).detach())


def test_cpu_module_with_cpu_inputs_trains_with_backward():
    reference = _net(3)
    model = copy.deepcopy(reference)
    x = torch.randn(6, 3, requires_grad=True)
    out = jit(model)(x)
    assert type(out) is torch.Tensor
    out.pow(2).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)


def test_grad_enabled_forward_runs_the_plain_program_and_backward_recomputes_it():
    reference = _net(3)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x1, x2 = torch.randn(8, 3), torch.randn(8, 3)
    out1, out2 = jitted(_jax(x1)), jitted(_jax(x2))  # grad enabled, no backward yet
    (program,) = jitted.programs.values()
    assert out1.requires_grad and not program.saves_residuals
    assert program.core.traces == 0  # only the forward program was traced
    ref1, ref2 = reference(x1), reference(x2)
    torch.testing.assert_close(_cpu(out2), ref2.detach(), rtol=1e-5, atol=1e-6)
    # Backward of the first output, after a second call changed the running statistics:
    # the recomputed forward uses the first call's inputs and buffers.
    (out1**2).mean().backward()
    (ref1**2).mean().backward()
    for (name, p), (_, r) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(_cpu(p.grad), r.grad, rtol=1e-4, atol=1e-6, msg=name)
    # From now on the forward saves jax.vjp's residuals (a training loop): same gradients.
    assert program.saves_residuals
    model.zero_grad()
    reference.zero_grad()
    (jitted(_jax(x2)) ** 2).mean().backward()
    (reference(x2) ** 2).mean().backward()
    for (name, p), (_, r) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(_cpu(p.grad), r.grad, rtol=1e-4, atol=1e-6, msg=name)
    torch.testing.assert_close(_cpu(model[1].running_mean), reference[1].running_mean)


def test_residual_saving_forward_differentiates_the_traced_program_without_tracing_again():
    # After a first backward, forwards save jax.vjp's residuals: a program derived from the
    # forward's kept jaxpr, so the module's Python runs once (the first trace), not per mode.
    runs = []

    class Counted(torch.nn.Linear):
        def forward(self, x):
            runs.append(1)
            return torch.tanh(super().forward(x))

    torch.manual_seed(0)
    reference = Counted(3, 2)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    for _ in range(3):
        x = torch.randn(4, 3)
        jitted(_jax(x)).sum().backward()
        reference(x).sum().backward()
        torch.testing.assert_close(_cpu(model.weight.grad), reference.weight.grad)
        model.zero_grad()
        reference.zero_grad()
    assert len(runs) == 1 + 3  # (the jitted one's trace, then the reference's three calls)


def test_a_differentiated_forward_compiles_nothing_after_its_first_backward(caplog):
    # The first backward runs the residual-saving forward on the call's inputs and key, then
    # its vjp: the programs the later calls run, so those compile none of their own.
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    compiled = []  # per call, the compilations of the residual-saving forward
    jax.config.update("jax_log_compiles", True)
    try:
        for _ in range(3):
            caplog.clear()
            x = torch.randn(8, 3)
            jitted(_jax(x)).pow(2).sum().backward()
            reference(x).pow(2).sum().backward()
            for p, r in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(_cpu(p.grad), r.grad, rtol=1e-4, atol=1e-6)
            model.zero_grad()
            reference.zero_grad()
            compiled.append(
                sum("Compiling jit(_traced_vjp)" in r.getMessage() for r in caplog.records)
            )
    finally:
        jax.config.update("jax_log_compiles", False)
    assert compiled == [1, 0, 0]


def test_checked_mode_differentiable_forward_raises_before_writing_and_grads_match():
    # Checked mode: the forward is the plain (checked) program, its backward recomputes it,
    # then forwards save residuals (from the entry's jaxpr, checks included): both raise.
    reference = torch.nn.Embedding(4, 3)
    with torchlax_core.enable():
        emb = copy.deepcopy(reference).to("jax")
    jitted = jit(lambda ids, w: (emb(ids) * w).sum())
    w = torch.randn(3, requires_grad=True)
    env = torchlax_core.current_env()
    env.config.checked = True
    try:
        for call in range(3):
            w_jax = _jax(w.detach()).requires_grad_()
            with pytest.raises(IndexError, match="index out of range"):
                jitted(_jax(torch.tensor([0, 7, 2])), w_jax)
            ids = torch.tensor([call, 3, 1])
            jitted(_jax(ids), w_jax).backward()
            (reference(ids) * w).sum().backward()
            torch.testing.assert_close(_cpu(emb.weight.grad), reference.weight.grad)
            torch.testing.assert_close(_cpu(w_jax.grad), w.grad)
            w.grad = None
        assert all(p.saves_residuals for p in jitted.programs.values())
    finally:
        env.config.checked = False


def test_recomputed_backward_sees_the_forwards_dropout_mask():
    with torchlax_core.enable():
        scale = torch.nn.Parameter(torch.tensor(3.0, device="jax"))

    def fn(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) * scale

    jitted = jit(fn)
    x = _jax(torch.rand(64) + 1)
    out = jitted(x)
    out.sum().backward()
    # d(sum(dropout(x) * scale)) / d(scale) is sum(dropout(x)) = sum(out) / scale for the
    # very mask of this forward; another mask would give another sum.
    torch.testing.assert_close(_cpu(scale.grad), _cpu(out.detach().sum() / 3.0))
    assert 0 < int((_cpu(out) == 0).sum()) < 64


@pytest.fixture
def repeats(monkeypatch) -> list[bool]:
    """Per no_grad forward call that tried the repeated-call shortcut (interop jit/_repeated
    ``_ForwardPlan``): whether it took it (True) or left it for the general path."""
    from torchlax_interop.jit import _repeated

    taken: list[bool] = []
    original = _repeated._ForwardPlan.call

    def counted(self, jitted, args):
        out = original(self, jitted, args)
        taken.append(out is not _repeated._MISSED)
        return out

    monkeypatch.setattr(_repeated._ForwardPlan, "call", counted)
    return taken


def test_repeated_no_grad_forward_follows_what_its_shortcut_checks(repeats):
    # A no_grad forward that repeats the last call skips the general path (interop jit/_repeated
    # ``_ForwardPlan``); each change below must leave it for the general one.
    torch.manual_seed(0)
    reference = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Dropout(1.0), torch.nn.Linear(4, 2)
    ).eval()
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    scale = _jax(torch.tensor(2.0))
    scaled = jit(lambda x: model(x) * scale)  # a closed-over tensor is state too

    def check(x, fn=jitted, expected=None):
        with torch.no_grad():
            want = reference(x) if expected is None else expected
            torch.testing.assert_close(_cpu(fn(_jax(x))), want)

    x = torch.randn(5, 3)
    check(x)
    check(x)
    assert repeats == [True]
    check(torch.randn(7, 3))  # another shape: another entry
    check(x)
    with torchlax_core.enable():
        model[0] = copy.deepcopy(reference[0]).to("jax")  # a new submodule: same values
    check(x)
    for m in (model, reference):
        m.train()  # Dropout(1.0) zeroes its input: the output is the last bias
    check(x)
    check(x)
    for m in (model, reference):
        m.eval()
    check(x)
    with torchlax_core.enable(), torch.no_grad():
        model[2].bias.add_(1)  # in place
    reference[2].bias.data.add_(1)
    check(x)
    check(x, scaled, reference(x).detach() * 2)
    check(x, scaled, reference(x).detach() * 2)
    with torch.no_grad():
        scale.mul_(3)
    check(x, scaled, reference(x).detach() * 6)
    env = torchlax_core.current_env()
    env.config.checked = True
    try:
        check(x)
        check(x)
    finally:
        env.config.checked = False
    assert True in repeats[1:] and False in repeats[1:]


class _ReadsItsGradAndFlags(torch.nn.Module):
    """A forward whose result depends on a parameter's .grad and requires_grad (not only on
    parameter values): what the repeated forward's guards alone can notice."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        y = self.lin(x)
        if self.lin.weight.grad is not None:
            y = y + self.lin.weight.grad.sum()
        if not self.lin.bias.requires_grad:
            y = y * 2
        return y


_global_offset: torch.Tensor | None = None  # rebound by the test below


def test_repeated_forward_notices_changes_that_leave_parameter_values_alone(repeats):
    # A .grad appearing, requires_grad turned off and a rebound global change what the
    # function computes but no value the last call read: the repeated no_grad forward
    # (interop jit/_repeated ``_ForwardPlan``, ``_Layout.holds_unchanged``) must leave its
    # shortcut for each, and repeat again after it.
    global _global_offset
    torch.manual_seed(0)
    reference = _ReadsItsGradAndFlags()
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    _global_offset = _jax(torch.tensor(1.0))
    jitted = jit(lambda x: model(x) + _global_offset)
    x = torch.randn(4, 3)

    def check_twice(offset: float):
        with torch.no_grad():
            want = reference(x) + offset
            for _ in range(2):
                torch.testing.assert_close(_cpu(jitted(_jax(x))), want)

    check_twice(1.0)
    grad = torch.randn(2, 3)
    reference.lin.weight.grad = grad
    model.lin.weight.grad = _jax(grad)
    check_twice(1.0)
    reference.lin.weight.grad = model.lin.weight.grad = None
    check_twice(1.0)
    for m in (model, reference):
        m.lin.bias.requires_grad_(False)
    check_twice(1.0)
    _global_offset = _jax(torch.tensor(5.0))
    check_twice(5.0)
    # Each change left the shortcut at the first call after it, and the call after repeated,
    # except while the .grad was there (a state with .grads is not reused: no shortcut).
    assert repeats == [True, False, True, False, True, False, True]


def test_repeated_forward_after_a_compiled_training_step_of_its_model():
    # The repeated no_grad forward launches before its layout checks, on the state arrays it
    # recorded; a compiled training step over the same model replaces them (and may donate
    # the old ones), so each forward after a step must run on the new ones, as eager does.
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    forward = jit(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(m, opt, x):
        opt.zero_grad()
        m(x).square().sum().backward()
        opt.step()

    train = jit(lambda x: step(model, opt, x))
    x = torch.randn(5, 3)
    for _ in range(2):
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(_cpu(forward(_jax(x))), reference(x))
        for _ in range(2):  # the first call runs eagerly (creating momentum), the second donates
            step(reference, ref_opt, x)
            train(_jax(x))


def test_repeated_forward_checks_what_its_launch_does_not(repeats):
    # The repeated no_grad forward launches the executable's C++ launcher directly, before
    # most of its checks (interop jit/_repeated ``_ForwardPlan``). The executable itself refuses
    # arrays of another shape or dtype, and tracers, but not another weak type: the shortcut
    # compares each argument's aval (weak type included) and leaves a launch that raises to
    # the general path.
    import jax
    import jax.numpy as jnp
    from torchlax_interop import call_torch

    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2)
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(lambda s: model(s * torch.ones(4, 3, device=s.device)))
    strong = jnp.array(2.0, jnp.float32)
    weak = jnp.asarray(2.0)  # a Python scalar's array: weakly typed
    assert weak.weak_type and not strong.weak_type
    with torch.no_grad():
        want = reference(torch.full((4, 3), 2.0))
        for array in (strong, strong, weak, weak):
            out = jitted(torchlax_core.wrap(array))
            assert out.dtype == torch.float32
            torch.testing.assert_close(_cpu(out), want)
        assert repeats == [True, False, True]
        # Inside an outer JAX trace the arguments hold tracers: the launcher raises, the
        # general path inlines the program into the trace.
        traced = jax.jit(lambda a: call_torch(jitted, a))(weak)
        torch.testing.assert_close(torch.from_numpy(jax.device_get(traced).copy()), want)
        assert repeats == [True, False, True, False]


def test_double_backward_raises_instead_of_returning_constant_gradients():
    x = _jax(torch.tensor([1.0, 2.0])).requires_grad_()
    y = jit(lambda x: (x**3).sum())(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y, x, create_graph=True)
    (g,) = torch.autograd.grad(jit(lambda x: (x**3).sum())(x), x)  # first order still works
    torch.testing.assert_close(_cpu(g), torch.tensor([3.0, 12.0]))


def test_repeated_forward_follows_every_change_to_its_module():
    # Forward calls reuse the last call's state while no parameter has a .grad (interop
    # jit/_state ``_Layout.assemble``): each change below must still reach the next call.
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x = torch.randn(5, 3)

    def check():
        with torch.no_grad():
            torch.testing.assert_close(_cpu(jitted(_jax(x))), reference(x))

    check()
    check()  # the reused state
    with torch.no_grad():
        for m in (model, reference):
            m[0].weight.mul_(-2)  # in place: same storage, new array
    check()
    new_weight = torch.randn(2, 4)
    reference[2].weight = torch.nn.Parameter(new_weight)
    with torchlax_core.enable():
        model[2].weight = torch.nn.Parameter(new_weight.to("jax"))  # a new parameter object
    check()
    model[0].bias.grad = _jax(torch.ones(4))  # a .grad: part of the state, not reused
    check()
    check()
    model[0].bias.grad = None
    check()
    model[0].bias.requires_grad_(False)
    reference[0].bias.requires_grad_(False)
    out = jitted(_jax(x))  # grad enabled: the output needs grad through the other parameters
    assert out.requires_grad
    torch.testing.assert_close(_cpu(out), reference(x).detach())
    for m in (model, reference):
        m.requires_grad_(False)
    assert not jitted(_jax(x)).requires_grad
    check()


def _scaled_output(module, args, output):
    return output * 100


def _shifted_input(module, args):
    return (args[0] + 1,)


def _lowered_output(module, args, output):
    return output - 7


def _lowered_output_with_kwargs(module, args, kwargs, output):
    return output - 3


# Hooks on one submodule, registered on the reference and the compiled model alike.
MODULE_HOOKS = {
    "forward-hook": lambda m: m[0].register_forward_hook(_scaled_output),
    "forward-pre-hook": lambda m: m[2].register_forward_pre_hook(_shifted_input),
    "forward-hook-with-kwargs": lambda m: m[2].register_forward_hook(
        _lowered_output_with_kwargs, with_kwargs=True
    ),
}


def _hooked_models():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    x = torch.randn(5, 3)
    jitted = jit(model)

    def check(grad: bool):
        # no_grad: the repeated-forward shortcut; grad enabled: the general path
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(_cpu(jitted(_jax(x))), reference(x).detach())

    return reference, model, check


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("name", list(MODULE_HOOKS))
def test_module_hook_registered_after_the_first_calls_is_applied(name, grad):
    # A hook runs while the program is traced: registering one must trace again, as eager
    # PyTorch runs it from the next call on.
    reference, model, check = _hooked_models()
    check(grad)
    check(grad)  # repeated
    handles = [MODULE_HOOKS[name](m) for m in (reference, model)]
    check(grad)
    check(grad)
    for handle in handles:
        handle.remove()
    check(grad)


@pytest.mark.parametrize("name", list(MODULE_HOOKS))
def test_module_hook_removed_after_the_first_calls_is_no_longer_applied(name):
    reference, model, check = _hooked_models()
    handles = [MODULE_HOOKS[name](m) for m in (reference, model)]
    check(False)
    check(False)
    for handle in handles:
        handle.remove()
    check(False)
    check(False)
    check(True)  # the general path


def test_hook_replaced_by_another_of_the_same_count_is_followed():
    # Same number of hooks in the dict before and after: only their keys tell them apart.
    reference, model, check = _hooked_models()
    handles = [m[0].register_forward_hook(_scaled_output) for m in (reference, model)]
    check(False)
    check(False)
    for handle in handles:
        handle.remove()
    for m in (reference, model):
        m[0].register_forward_hook(_lowered_output)
    check(False)
    check(False)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_global_forward_hook_registered_after_the_first_call_is_applied(grad):
    from torch.nn.modules.module import register_module_forward_hook

    reference, model, check = _hooked_models()
    check(grad)
    check(grad)

    def doubled_linear(module, args, output):
        return output * 2 if isinstance(module, torch.nn.Linear) else None

    handle = register_module_forward_hook(doubled_linear)
    try:
        check(grad)
        check(grad)
    finally:
        handle.remove()
    check(grad)
    check(grad)


def test_hook_registered_elsewhere_keeps_the_repeated_forward(repeats):
    # Empty hook dicts are re-checked only after some registration in the process (a handle
    # id was taken); one on an unrelated module finds them still empty: the shortcut stays.
    reference, model, check = _hooked_models()
    check(False)
    check(False)
    unrelated = torch.nn.Linear(2, 2)
    unrelated.register_forward_hook(_scaled_output)
    del repeats[:]
    check(False)
    check(False)
    assert repeats == [True, True]


def test_repeated_forward_results_are_new_tensors_as_eager_makes_them(repeats):
    # The repeated forward's result tensors are made ahead, in batches (core
    # ``ResultWrappers``): each call still returns a tensor of its own, with its own storage,
    # laid out as eager's result, and one made under inference mode is an inference tensor
    # (PyTorch marks a tensor as such when it is made).
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x = torch.randn(5, 3)
    want = reference(x).detach()
    with torch.no_grad():
        outs = [jitted(_jax(x)) for _ in range(6)]
    assert repeats == [True] * 5
    assert len({id(o) for o in outs}) == len({id(o._storage) for o in outs}) == 6
    for out in outs:
        assert (out.shape, out.stride(), out.dtype, out.device.type) == (
            want.shape,
            want.stride(),
            want.dtype,
            "jax",
        )
        assert not out.requires_grad and out._base is None and not out.is_inference()
        torch.testing.assert_close(_cpu(out), want)
    with torch.no_grad():
        outs[0].add_(1)  # in place: no other result shares its storage
    torch.testing.assert_close(_cpu(outs[0]), want + 1)
    torch.testing.assert_close(_cpu(outs[1]), want)
    with torch.inference_mode():
        inference = jitted(_jax(x))
        with torch.inference_mode():
            eager = model(_jax(x))
    assert repeats[-1] is True
    assert inference.is_inference() and eager.is_inference()
    torch.testing.assert_close(_cpu(inference), want)
    with torch.no_grad():
        assert not jitted(_jax(x)).is_inference()


def test_repeated_forward_follows_a_reordered_sequential(repeats):
    # nn.Sequential runs its submodules in the order of its ``_modules`` dict: the same names
    # and modules in another order are another function, and the repeated forward's check
    # of the module dicts (names in order, then values) must see it.
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
    with torchlax_core.enable():
        model = copy.deepcopy(reference).to("jax")
    jitted = jit(model)
    x = torch.randn(4, 3)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(_cpu(jitted(_jax(x))), reference(x))
        for m in (model, reference):
            tanh = m._modules.pop("1")
            m._modules["1"] = tanh  # Linear, Linear, Tanh
        for _ in range(2):
            torch.testing.assert_close(_cpu(jitted(_jax(x))), reference(x))
    assert repeats == [True, False, True]


@pytest.mark.parametrize("first", ["cpu", "jax"])
def test_module_moved_to_the_other_device_in_place_between_calls(first):
    # module.to() swaps each tensor object's class and data in place (the same Parameter
    # objects): the next call must see the module's tensors where they now are (a CPU module's
    # program lent them through DLPack).
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    expected = module(x).detach()
    second = "jax" if first == "cpu" else "cpu"
    with torchlax_core.enable():
        module.to(first)
        compiled = jit(module)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x.to(first)).cpu(), expected)
            module.to(second)
            weight = module.weight
            assert isinstance(weight, torchlax_core.Tensor) == (second == "jax")
            torch.testing.assert_close(compiled(x.to(second)).cpu(), expected)
    assert module.weight is weight
