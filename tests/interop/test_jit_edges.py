"""jit: behaviours at the edges of its stages that no other test reached (found by coverage of
``torchlax_interop/jit``): argument forms, what a returned object may hold, the state walk's
rarer finds, and refusals of a step's changes to state it cannot return."""

import collections

import pytest
import torch
import torchlax
import torchlax_core
from torch import nn
from torchlax_interop import from_torch, jit


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu() if isinstance(t, torchlax_core.Tensor) else t


# -- arguments -------------------------------------------------------------------------------


def test_static_argnums_and_argnames_not_passed_take_their_defaults():
    def f(x, n=2, *, scale=3.0):
        return x * n * scale

    x = torch.randn(3)
    fn = jit(f, static_argnums=(1,), static_argnames=("scale",))
    torch.testing.assert_close(_cpu(fn(from_torch(x))), f(x))
    torch.testing.assert_close(_cpu(fn(from_torch(x), 4)), f(x, 4))


def test_a_keyword_call_after_a_repeated_one_takes_the_general_path():
    fn = jit(lambda x: x * 2)
    x = torch.randn(3)
    with torch.no_grad():
        for _ in range(2):  # the second call repeats the first's plan
            fn(from_torch(x))
        torch.testing.assert_close(_cpu(fn(x=from_torch(x))), x * 2)


def test_an_argument_object_passed_twice_is_walked_once():
    with torchlax.enable():
        model = nn.Linear(3, 2).to("jax")
        x = torch.randn(4, 3, device="jax")
    fn = jit(lambda a, b, x: a(x) + b(x))
    want = model(x) * 2
    torch.testing.assert_close(_cpu(fn(model, model, x)), _cpu(want))


def test_a_closure_cell_never_bound_is_no_state():
    def make():
        def f(x):
            if x is None:
                return unbound  # noqa: F821  (a cell of the enclosing function, never bound)
            return x + 1

        return f
        unbound = 0  # pyright: ignore[reportUnreachable]

    x = torch.randn(3)
    torch.testing.assert_close(_cpu(jit(make())(from_torch(x))), x + 1)


# -- returned objects ------------------------------------------------------------------------


class _Box:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Slotted:
    __slots__ = ("y", "unset")

    def __init__(self, y):
        self.y = y


def test_a_returned_object_without_computed_tensors_is_a_constant():
    fn = jit(lambda x: (x * 2, _Box(n=3)))
    out, box = fn(from_torch(torch.ones(2)))
    assert type(box) is _Box and box.n == 3
    torch.testing.assert_close(_cpu(out), torch.full((2,), 2.0))


def test_a_returned_object_rebuilt_through_tuples_ordered_dicts_and_slots():
    def f(x):
        y = x * 2
        cpu = torch.zeros(2)  # a CPU tensor: a concrete value, kept as it is
        return _Box(
            pair=(y, 1),
            named=collections.OrderedDict(a=y + 1),
            slotted=_Slotted(y - 1),
            again=y,  # the same tensor twice: one output, both places hold it
            cpu=cpu,
        )

    fn = jit(f)
    for value in (1.0, 2.0):
        x = torch.full((2,), value)
        box = fn(from_torch(x))
        torch.testing.assert_close(_cpu(box.pair[0]), x * 2)
        assert box.pair[1] == 1 and type(box.pair) is tuple
        assert type(box.named) is collections.OrderedDict
        torch.testing.assert_close(_cpu(box.named["a"]), x * 2 + 1)
        torch.testing.assert_close(_cpu(box.slotted.y), x * 2 - 1)
        assert box.again is box.pair[0]
        torch.testing.assert_close(box.cpu, torch.zeros(2))


def test_a_returned_object_holding_a_computed_tensor_twice_through_one_object_raises():
    def f(x):
        inner = _Box(y=x * 2)
        return _Box(a=inner, b=inner)

    with pytest.raises(torchlax.JitError, match="same object holding computed tensors twice"):
        jit(f)(from_torch(torch.ones(2)))


def test_a_returned_closure_over_a_computed_tensor_raises():
    def f(x):
        y = x * 2
        return _Box(get=lambda: y)

    with pytest.raises(torchlax.JitError, match="cannot put another in its place"):
        jit(f)(from_torch(torch.ones(2)))


# -- the state walk --------------------------------------------------------------------------


def _eager_and_jitted_steps(make_step, calls: int = 3):
    """The parameters after ``calls`` steps eagerly and jitted, from the same start."""
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        with torchlax.enable():
            model = nn.Linear(3, 2).to("jax")
            x = torch.randn(4, 3, device="jax")
        step = make_step(model)
        if compiled:
            step = jit(step)
        for _ in range(calls):
            step(x)
        results.append([_cpu(p.detach()) for p in model.parameters()])
    return results


def test_a_scheduler_whose_optimizer_the_step_reaches_only_through_it():
    def make_step(model):
        sched = torch.optim.lr_scheduler.StepLR(
            torch.optim.SGD(model.parameters(), lr=0.1), step_size=1, gamma=0.5
        )

        def step(x):
            sched.optimizer.zero_grad()
            loss = model(x).sum()
            loss.backward()
            sched.optimizer.step()
            sched.step()
            return loss

        return step

    eager, compiled = _eager_and_jitted_steps(make_step)
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want)


def test_a_scheduler_the_walk_meets_before_its_optimizer():
    # (closure cells in name order: ``lr_schedule`` first) One optimizer of the state, not two
    # whose learning rate the program would set twice.
    def make_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        lr_schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(x):
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            lr_schedule.step()
            return loss

        assert step.__code__.co_freevars[0] == "lr_schedule"
        return step

    eager, compiled = _eager_and_jitted_steps(make_step)
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want)


def test_an_unhashable_value_in_a_param_group_keys_the_program_by_its_repr():
    def make_step(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.param_groups[0]["note"] = {"kind": "head"}  # (an extra entry: PyTorch keeps it)

        def step(x):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        return step

    eager, compiled = _eager_and_jitted_steps(make_step)
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want)


# -- refusals --------------------------------------------------------------------------------


def test_a_scheduler_stepped_with_an_argument_inside_the_step_is_refused():
    with torchlax.enable():
        model = nn.Linear(3, 2).to("jax")
        x = torch.randn(4, 3, device="jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)

    def step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        sched.step(loss)
        return loss

    fn = jit(step)
    with pytest.raises(torchlax.JitError, match=r"scheduler.step\(\) with arguments"):
        for _ in range(2):  # (the first call runs eagerly where its trace is refused)
            fn(x)


class _CountingSGD(torch.optim.SGD):
    """An SGD that keeps a Python counter in its state: a constant of a compiled step."""

    def step(self, closure=None):  # pyright: ignore[reportIncompatibleMethodOverride]
        for group in self.param_groups:
            for p in group["params"]:
                entries = self.state[p]
                entries["calls"] = entries.get("calls", 0) + 1
        return super().step(closure)


def test_an_optimizer_changing_a_python_state_value_is_refused():
    with torchlax.enable():
        model = nn.Linear(3, 2).to("jax")
        x = torch.randn(4, 3, device="jax")
    opt = _CountingSGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    fn = jit(step)
    with pytest.raises(torchlax.JitError, match="non-tensor state value 'calls'"):
        for _ in range(3):
            fn(x)


def test_a_write_into_a_constant_under_a_default_argument_names_it_as_such():
    with torchlax.enable():
        x = torch.randn(3, device="jax")
        counter = torch.zeros(3, device="jax")

    # (a tensor under an object's attribute is no state: a constant of the program)
    def f(x, cfg=_Box(counter=counter)):  # noqa: B008  (the default is the point)
        cfg.counter.add_(1)
        return x + cfg.counter

    with pytest.raises(
        torchlax.JitError, match="held as the function's default argument 'cfg'.counter"
    ):
        jit(f)(x)
    torch.testing.assert_close(_cpu(counter), torch.zeros(3))  # put back


def test_a_returned_jax_value_is_refused():
    with pytest.raises(torchlax.JitError, match="JAX value computed inside the function"):
        jit(lambda x: (x * 2).jax())(from_torch(torch.ones(2)))


def test_a_returned_object_too_deep_to_search_is_refused():
    def f(x):
        box = _Box(y=x * 2)
        for _ in range(20):
            box = _Box(inner=box)
        return box

    with pytest.raises(torchlax.JitError, match="too deep or too large to search"):
        jit(f)(from_torch(torch.ones(2)))


class _CopiesToItself(_Box):
    def __copy__(self):
        return self


def test_a_returned_object_that_copy_does_not_copy_is_refused():
    with pytest.raises(torchlax.JitError, match="is not copied by copy.copy"):
        jit(lambda x: _CopiesToItself(y=x * 2))(from_torch(torch.ones(2)))


def test_outputs_returned_some_in_memory_order_some_not():
    x = torch.randn(3, 4)
    fn = jit(lambda x: (x * 2, (x * 3).t()))
    a, b = fn(from_torch(x))
    torch.testing.assert_close(_cpu(a), x * 2)
    torch.testing.assert_close(_cpu(b), (x * 3).t())
    assert b.stride() == (x * 3).t().stride()


def test_an_expanded_input_and_views_in_repeated_forwards():
    base = torch.randn(4, 3)
    fn = jit(lambda x: x * 2)
    with torch.no_grad():
        expanded = from_torch(torch.randn(3)).expand(4, 3)  # (zero strides: passed by value)
        torch.testing.assert_close(_cpu(fn(expanded)), _cpu(expanded) * 2)
        jax_base = from_torch(base)
        # a column slice: not contiguous, but in row-major order (traced as row-major)
        torch.testing.assert_close(_cpu(fn(jax_base[:, :2])), base[:, :2] * 2)
        for rows in (slice(0, 2), slice(1, 3), slice(2, 4)):  # contiguous views: repeats
            torch.testing.assert_close(_cpu(fn(jax_base[rows])), base[rows] * 2)


def test_a_forward_called_with_another_module_argument_walks_again():
    with torchlax.enable():
        a, b = nn.Linear(3, 2).to("jax"), nn.Linear(3, 2).to("jax")
        x = torch.randn(4, 3, device="jax")
    fn = jit(lambda m, x: m(x))
    with torch.no_grad():
        for m in (a, a, b, a):
            torch.testing.assert_close(_cpu(fn(m, x)), _cpu(m(x)))


def test_a_forward_hook_registered_after_repeated_calls_runs():
    with torchlax.enable():
        model = nn.Linear(3, 2).to("jax")
        x = torch.randn(4, 3, device="jax")
    fn = jit(model)
    with torch.no_grad():
        want = _cpu(model(x))
        for _ in range(2):
            torch.testing.assert_close(_cpu(fn(x)), want)
        handle = model.register_forward_hook(lambda m, args, out: out * 2)
        torch.testing.assert_close(_cpu(fn(x)), want * 2)
        handle.remove()
        torch.testing.assert_close(_cpu(fn(x)), want)


def test_a_step_without_an_optimizer_that_gives_grads_runs_as_a_step():
    # Guessed a forward (no optimizer), its trace tells it trains: the donating program runs.
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        with torchlax.enable():
            model = nn.Linear(3, 2).to("jax")
            x = torch.randn(4, 3, device="jax")

        def step(x, model=model):
            model.zero_grad()
            model(x).sum().backward()

        (jit(step) if compiled else step)(x)
        grads.append([_cpu(p.grad) for p in model.parameters()])
    for want, got in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)


def _sgd_step(model, opt):
    def step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def test_a_training_step_called_with_a_transposed_view_after_repeats():
    losses = []
    for compiled in (False, True):
        torch.manual_seed(0)
        with torchlax.enable():
            model = nn.Linear(3, 2).to("jax")
            x = torch.randn(4, 3, device="jax")
            xt = torch.randn(3, 4, device="jax").t()  # (4, 3), not contiguous
        step = _sgd_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
        fn = jit(step) if compiled else step
        losses.append([_cpu(fn(v)) for v in (x, x, x, xt, x)])
    for want, got in zip(*losses, strict=True):
        torch.testing.assert_close(got, want)


def test_a_plain_cpu_inference_tensor_read_by_the_step():
    with torch.inference_mode():
        c = torch.arange(3.0)  # (no version counter)
    x = torch.randn(3)
    fn = jit(lambda x: x + c.to("jax"))
    for _ in range(2):
        torch.testing.assert_close(_cpu(fn(from_torch(x))), x + c)


class _LabelledSGD(torch.optim.SGD):
    """An SGD that keeps a Python value in its state it never changes after setting it."""

    def step(self, closure=None):  # pyright: ignore[reportIncompatibleMethodOverride]
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["label"] = "sgd"
        return super().step(closure)


def test_an_optimizer_keeping_an_unchanged_python_state_value_trains():
    def make_step(model):
        return _sgd_step(model, _LabelledSGD(model.parameters(), lr=0.1, momentum=0.9))

    eager, compiled = _eager_and_jitted_steps(make_step)
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want)
