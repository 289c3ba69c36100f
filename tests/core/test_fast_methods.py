"""Hot Tensor operators served before PyTorch's dispatcher (``torchlax_core._fast_methods``).

Each served case is compared with eager PyTorch on the CPU (values, dtype, shape, strides, no
``_base``) on the call the fast path serves, which must reach ``__torch_dispatch__`` not at
all; each unsupported case must reach it, with PyTorch's result.
"""

from __future__ import annotations

import threading

import jax
import pytest
import torch
import torchlax_core
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torchlax_core import _tensor, hookimpl
from torchlax_core._x64 import x64_flag


@pytest.fixture
def dispatched(monkeypatch):
    """The ATen ops that reached ``Tensor.__torch_dispatch__`` (a list, appended to)."""
    seen: list = []
    run_op = _tensor.run_op

    def counting(env, func, args, kwargs, **options):
        seen.append(func)
        return run_op(env, func, args, kwargs, **options)

    monkeypatch.setattr(_tensor, "run_op", counting)
    return seen


def _jax(cpu: torch.Tensor) -> torch.Tensor:
    return cpu.to("jax")


def _assert_like(out, expected: torch.Tensor) -> None:
    assert type(out) is torchlax_core.Tensor
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert out.stride() == expected.stride() and out._base is None
    torch.testing.assert_close(out.cpu(), expected)


def _f32(*shape):
    return torch.randn(*shape)


def _i64(*shape):
    return torch.randint(-5, 6, shape)


def _bool(*shape):
    return torch.rand(*shape) > 0.5


_SERVED_CASES = {
    "a + b": (lambda a, b: a + b, [_f32(3, 4), _f32(3, 4)]),
    "broadcast a + b": (lambda a, b: a + b, [_f32(3, 1), _f32(4)]),
    "int + int scalar": (lambda a: a + 2, [_i64(5)]),
    "int + float scalar": (lambda a: a + 2.5, [_i64(5)]),
    "bool * bool scalar": (lambda a: a * True, [_bool(5)]),
    "bool + bool": (lambda a, b: a + b, [_bool(5), _bool(5)]),
    "int / int": (lambda a, b: a / b, [_i64(5), _i64(5).abs() + 1]),
    "float32 + float64": (lambda a, b: a + b, [_f32(4), torch.randn(4, dtype=torch.float64)]),
    "0-d int + float32": (lambda a, b: a + b, [torch.tensor(3), _f32(4)]),
    "0-d - 0-d": (lambda a, b: a - b, [torch.tensor(1.5), torch.tensor(0.25)]),
    "float16 + float scalar": (lambda a: a + 2.0, [_f32(5).half()]),  # stays float16
    "bool + int scalar": (lambda a: a + 1, [_bool(5)]),
    "a.sub(b)": (lambda a, b: a.sub(b), [_f32(2, 3), _f32(3)]),
    "a.mul(b)": (lambda a, b: a.mul(b), [_i64(2, 3), _f32(2, 3)]),
    "a.div(3)": (lambda a: a.div(3), [_f32(2, 3)]),
    "a ** 2": (lambda a: a**2, [_f32(6)]),
    "a ** 0.5": (lambda a: a**0.5, [_f32(6).abs()]),
    "int a.pow(b)": (lambda a, b: a.pow(b), [_i64(6), _i64(6).abs()]),
    "-a": (lambda a: -a, [_f32(6)]),
    "a.neg()": (lambda a: a.neg(), [_i64(6)]),
    "a.relu()": (lambda a: a.relu(), [_f32(6)]),
    "a.tanh()": (lambda a: a.tanh(), [_f32(6)]),
    "a @ b": (lambda a, b: a @ b, [_f32(3, 4), _f32(4, 5)]),
    "a.matmul(b)": (lambda a, b: a.matmul(b), [_f32(3, 4), _f32(4, 5)]),
    "a.mm(b)": (lambda a, b: a.mm(b), [_f32(3, 4), _f32(4, 5)]),
    "c.addmm(a, b)": (lambda c, a, b: c.addmm(a, b), [_f32(5), _f32(3, 4), _f32(4, 5)]),
}


@pytest.mark.parametrize("case", list(_SERVED_CASES))
def test_a_served_call_equals_pytorch_and_skips_the_dispatcher(env, dispatched, case):
    fn, cpu = _SERVED_CASES[case]
    expected = fn(*cpu)
    args = [_jax(t) for t in cpu]
    for _ in range(2):  # a plain run, then the compile: both through the dispatcher
        _assert_like(fn(*args), expected)
    assert dispatched
    dispatched.clear()
    hits = env.stats()["op_cache_hits"]
    out = fn(*args)
    assert dispatched == []  # served before PyTorch's dispatcher...
    assert env.stats()["op_cache_hits"] == hits + 1  # ...by the op cache's executable
    _assert_like(out, expected)


def _filled(fn, *args):
    """``fn(*args)`` three times (the cache then holds it), returning the last result."""
    fn(*args)
    fn(*args)
    return fn(*args)


def test_python_numbers_of_equal_value_are_told_apart(env, dispatched):
    # 1 == 1.0 == True and 0.0 == -0.0 in Python, but PyTorch's results differ: the cache key
    # of a number on the right (serve_pair's) must not serve one with the other's executable.
    b_cpu, x_cpu = _bool(6), torch.rand(5) + 1
    b, x = _jax(b_cpu), _jax(x_cpu)
    _filled(lambda: b + 1)  # int64, served from now on
    _filled(lambda: x * 0.0)
    for fn in (lambda t: t + True, lambda t: t + 1.0):  # bool, float32: not that executable
        dispatched.clear()
        _assert_like(fn(b), fn(b_cpu))
        assert torch.ops.aten.add.Tensor in dispatched
    dispatched.clear()
    assert (1 / (x * -0.0).cpu() == float("-inf")).all()
    assert torch.ops.aten.mul.Tensor in dispatched


def test_served_outside_64_bit_mode_keeps_64_bit_dtypes(env):
    # With JAX's 64-bit mode off in this thread (as outside ``enable``), the hit runs inside
    # it, as run_op does, and the result stays float64/int64.
    f_cpu, i_cpu = torch.randn(4, dtype=torch.float64), _i64(4)
    f, i = _jax(f_cpu), _jax(i_cpu)
    results = []

    def outside():  # a fresh thread, the fixture's environment current, 64-bit mode off
        with torchlax_core.enable(env), jax.enable_x64(False):
            assert not x64_flag.value
            for _ in range(3):
                results.append((f + f, i * 3, -f))

    worker = threading.Thread(target=outside)
    hits = env.stats()["op_cache_hits"]
    worker.start()
    worker.join()
    assert len(results) == 3 and env.stats()["op_cache_hits"] >= hits + 3
    for added, scaled, negated in results:
        _assert_like(added, f_cpu + f_cpu)
        _assert_like(scaled, i_cpu * 3)
        _assert_like(negated, -f_cpu)


def test_environments_used_in_turn_and_in_threads_each_serve_from_their_own_cache(env):
    # The fast methods remember an overload's hit function per environment table
    # (_fast_methods._Serving): another environment, in this thread or another one running at
    # the same time, must be served from its own cache and counted in its own statistics.
    other = torchlax_core.Environment()
    a_cpu, b_cpu = torch.randn(8), torch.randn(8)
    a, b = _jax(a_cpu), _jax(b_cpu)
    calls = 40

    def run(environment, out: list):
        with torchlax_core.enable(environment):
            for _ in range(calls):
                out.append(a + b)

    before = env.stats()["op_cache_hits"], other.stats()["op_cache_hits"]
    mine: list = []
    theirs: list = []
    worker = threading.Thread(target=run, args=(other, theirs))
    worker.start()
    run(env, mine)
    worker.join()
    for environment, previous in zip((env, other), before, strict=True):
        assert environment.stats()["op_cache_hits"] - previous >= calls - 2
    assert other.stats()["op_cache_hits"] - before[1] <= calls
    for out in mine + theirs:
        _assert_like(out, a_cpu + b_cpu)
    for _ in range(3):  # in turn, in one thread
        hits = env.stats()["op_cache_hits"], other.stats()["op_cache_hits"]
        with torchlax_core.enable(other):
            in_other = a + b
        in_env = a + b
        assert (env.stats()["op_cache_hits"], other.stats()["op_cache_hits"]) == (
            hits[0] + 1,
            hits[1] + 1,
        )
        _assert_like(in_env, a_cpu + b_cpu)
        _assert_like(in_other, a_cpu + b_cpu)


def test_autograd_recording_falls_through_and_records(env, dispatched):
    a_cpu, b_cpu = torch.randn(4, requires_grad=True), torch.randn(4)
    a, b = _jax(a_cpu.detach()).requires_grad_(), _jax(b_cpu)
    with torch.no_grad():
        _filled(lambda: a * b)  # served without grad...
    dispatched.clear()
    out = a * b  # ...but here autograd must record
    assert dispatched and type(out.grad_fn).__name__ == "MulBackward0"
    out.sum().backward()
    (a_cpu * b_cpu).sum().backward()
    assert a.grad is not None
    torch.testing.assert_close(a.grad.cpu(), a_cpu.grad)


def test_modes_see_every_call(env):
    a, b = _jax(torch.randn(4)), _jax(torch.randn(4))
    _filled(lambda: a + b)

    class Recording(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    class RecordingFunctions(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.functions = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.functions.append(func)
            return func(*args, **(kwargs or {}))

    with Recording() as mode:
        out = a + b
    assert mode.ops == [torch.ops.aten.add.Tensor]
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu())
    with RecordingFunctions() as function_mode:
        out = a @ b.reshape(4, 1)
    assert torch.Tensor.matmul in function_mode.functions
    torch.testing.assert_close(out.cpu(), a.cpu() @ b.cpu().reshape(4, 1))


def test_under_vmap_and_autocast_falls_through(env, dispatched):
    x_cpu, b_cpu, c_cpu = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    x, b, c = _jax(x_cpu), _jax(b_cpu), _jax(c_cpu)
    _filled(lambda: b + c)
    dispatched.clear()
    out = torch.func.vmap(lambda row: row * (b + c))(x)  # b + c: unbatched, inside vmap
    assert torch.ops.aten.add.Tensor in dispatched
    torch.testing.assert_close(out.cpu(), x_cpu * (b_cpu + c_cpu))

    m1, m2 = _jax(torch.randn(3, 4)), _jax(torch.randn(4, 5))
    _filled(lambda: m1 @ m2)
    with torch.autocast("jax", dtype=torch.bfloat16):
        assert (m1 @ m2).dtype == torch.bfloat16  # as autocast on the CPU


def test_keywords_and_views_fall_through(env, dispatched):
    a_cpu, b_cpu = torch.randn(4, 3), torch.randn(3, 4)
    a, b = _jax(a_cpu), _jax(b_cpu)
    _filled(lambda: a.add(a))
    dispatched.clear()
    _assert_like(a.add(a, alpha=2), a_cpu.add(a_cpu, alpha=2))
    assert dispatched
    out = _filled(lambda: a.t() + b)  # the view's layout: PyTorch's TensorIterator decides
    expected = a_cpu.t() + b_cpu
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize(
    "case",
    ["1-d @ 2-d", "3-d @ 3-d", "2-d @ 1-d", "view @ 2-d", "mm of views", "float32 @ float64"],
)
def test_matmul_of_other_ranks_views_and_dtypes_is_pytorchs(env, case):
    # 2-d root Tensors take mm's serve_pair; every other call takes the general rule or
    # PyTorch's own method, with PyTorch's result or PyTorch's exception.
    a_cpu, b_cpu = {
        "1-d @ 2-d": (_f32(4), _f32(4, 5)),
        "3-d @ 3-d": (_f32(2, 3, 4), _f32(2, 4, 5)),
        "2-d @ 1-d": (_f32(3, 4), _f32(4)),
        "view @ 2-d": (_f32(4, 3).t(), _f32(4, 5)),
        "mm of views": (_f32(4, 3).t(), _f32(5, 4).t()),
        "float32 @ float64": (_f32(3, 4), torch.randn(4, 5, dtype=torch.float64)),
    }[case]
    # a transposed CPU tensor becomes the same transposed view of a torchlax Tensor
    a, b = (_jax(t) if t.is_contiguous() else _jax(t.t().contiguous()).t() for t in (a_cpu, b_cpu))
    call = (lambda x, y: x.mm(y)) if case == "mm of views" else (lambda x, y: x @ y)
    if case == "float32 @ float64":
        with pytest.raises(RuntimeError) as expected:
            call(a_cpu, b_cpu)
        for _ in range(3):
            with pytest.raises(type(expected.value)):
                call(a, b)
        return
    expected = call(a_cpu, b_cpu)
    for _ in range(3):  # dispatched, compiled, then (where it can be) served
        out = call(a, b)
        assert out.dtype == expected.dtype and out.shape == expected.shape
        torch.testing.assert_close(out.cpu(), expected)


class _AddOverride:
    @hookimpl
    def torchlax_register_lowerings(self, registry):
        registry.register_function(torch.Tensor.add, lambda x, y: torch.full_like(x, 42.0))


def test_torch_level_overrides_take_precedence(env):
    a, b = _jax(torch.randn(4)), _jax(torch.randn(4))
    _filled(lambda: a + b)
    name = env.register_plugin(_AddOverride(), "test-fast-methods-function")
    try:
        with torch.no_grad():
            torch.testing.assert_close((a + b).cpu(), torch.full((4,), 42.0))
    finally:
        env.unregister_plugin(name)
