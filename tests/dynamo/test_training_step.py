"""torch.compile(step, backend="torchlax") over a whole training step, optimizer included.

The step (zero_grad, forward, loss.backward(), optimizer.step()) is compiled by Dynamo with
``loss.backward()`` traced into the graph (the backend turns Dynamo's ``trace_autograd_ops``
on inside its own calls): forward with backward as one graph, the optimizer step another,
whether the loss is detached before ``opt.step()`` or returned undetached (then it is handed
out detached inside the graph with a ``grad_fn`` that raises, instead of Dynamo restarting the
capture with the backward apart). Each graph must be an XLA program with no op left to eager
PyTorch, on CPU tensors and on torchlax Tensors.

References: the same step, eagerly, on the CPU, in float64 to 1e-10. (Under torch.compile,
torch.optim's Adam family computes its bias corrections from the tensor ``step``, which has the
default dtype; eagerly they are Python floats. With float32 as the default, compiled Adam
differs from eager at float32 precision with every backend, PyTorch's ``aot_eager`` included.)
"""

import copy
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchlax_core
import torchlax_dynamo
from torch import nn
from torchlax_core.internal import storage_of

counters = torchlax_dynamo.counters
STEPS = 5

OPTIMIZERS = {
    "sgd_momentum_nesterov_wd": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2
    ),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw_loop": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-1),
    # foreach=False: one op per parameter instead of one _foreach_ op per state list.
    "sgd_loop": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=False
    ),
    "adam_loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "rmsprop_loop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, foreach=False),
    "adagrad_loop": lambda p: torch.optim.Adagrad(p, lr=1e-1, foreach=False),
}


pytestmark = pytest.mark.usefixtures("float64_default")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _make_step(model, optimizer):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        loss = loss.detach()  # before opt.step(): forward and backward are one program
        optimizer.step()
        return loss

    return step


def _data():
    torch.manual_seed(1)
    return torch.randn(10, 6), torch.randint(0, 3, (10,))


# Every optimizer runs on torchlax Tensors; CPU tensors take the same path after promotion, so
# two optimizers cover them.
_CASES = [(name, True) for name in sorted(OPTIMIZERS)] + [
    (name, False) for name in ("adamw", "sgd_momentum_nesterov_wd")
]


@pytest.mark.parametrize(
    "name, on_jax", _CASES, ids=[f"{n}-{'torchlax' if j else 'cpu'}" for n, j in _CASES]
)
def test_step_matches_eager_and_runs_as_xla_programs(name, on_jax):
    x, y = _data()
    eager_model = _model()
    eager_step = _make_step(eager_model, OPTIMIZERS[name](eager_model.parameters()))
    with torchlax_core.enable():
        model = _model().to("jax") if on_jax else _model()
        step = torch.compile(
            _make_step(model, OPTIMIZERS[name](model.parameters())), backend="torchlax"
        )
        cx, cy = (x.to("jax"), y.to("jax")) if on_jax else (x, y)
        tol = dict(atol=1e-10, rtol=1e-10)
        for i in range(STEPS):
            expected = eager_step(x, y)
            loss = step(cx, cy)
            assert type(loss) is (torchlax_core.Tensor if on_jax else torch.Tensor)
            torch.testing.assert_close(loss.cpu(), expected, **tol, msg=f"step {i}")
            if i == 1:
                first_calls = dict(counters)
        for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), **tol)
    assert counters["eager_nodes"] == 0, dict(counters)  # nothing ran op by op
    # Forward with backward, and the optimizer step (SGD with momentum compiles its first step,
    # which creates the momentum buffers, apart): each graph one XLA program.
    assert 2 <= counters["graphs"] == counters["xla_programs"] <= 3, dict(counters)
    assert dict(counters) == first_calls  # steady state: nothing compiles after step 2


def test_state_lives_on_the_module_and_optimizer():
    """What the compiled optimizer step writes is the user's own state, as eagerly."""
    x, y = _data()
    with torchlax_core.enable():
        model = _model().to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = torch.compile(_make_step(model, opt), backend="torchlax")
        before = copy.deepcopy(model.state_dict())
        step(x.to("jax"), y.to("jax"))
        step(x.to("jax"), y.to("jax"))
        state = opt.state[next(iter(model.parameters()))]
        assert float(state["step"]) == 2
        assert isinstance(state["exp_avg"], torchlax_core.Tensor)
        # The step counter lives beside the parameters (Dynamo's CUDA rule), not on the CPU.
        assert isinstance(state["step"], torchlax_core.Tensor)
        assert opt.param_groups[0]["capturable"]
        changed = [
            k for k, v in model.state_dict().items() if not torch.equal(v.cpu(), before[k].cpu())
        ]
        assert len(changed) == len(before)


def test_optimizer_state_is_donated_unless_something_else_holds_it():
    """The optimizer program updates the state in place (its old arrays donated to XLA), but
    never an array someone else can still read: one handed out with ``t.jax()`` survives the
    step. Deterministic: an earlier failed ``torch.compile`` in the process changes nothing
    (it did under the old reference-count rule)."""
    failed = torch.compile(lambda t: t + 1, backend="torchlax", options={"nonsense": 1})
    with pytest.raises(Exception, match="unknown options"):
        failed(torch.ones(2))
    x, y = _data()
    with torchlax_core.enable():
        model = _model().to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = torch.compile(_make_step(model, opt), backend="torchlax")
        step(x.to("jax"), y.to("jax"))
        first, second = list(model.parameters())[:2]
        held = opt.state[first]["exp_avg"].jax()  # handed out: never donated
        held_value = np.asarray(held).copy()
        alias = second.detach()  # shares the parameter's storage, as in PyTorch
        # The arrays the first step wrote, seen without handing them out.
        private = [storage_of(second).array, storage_of(opt.state[second]["exp_avg"]).array]
        previous = np.asarray(private[0]).copy()
        step(x.to("jax"), y.to("jax"))
    assert all(a.is_deleted() for a in private)  # donated: XLA wrote the new state over them
    assert not held.is_deleted()
    np.testing.assert_array_equal(np.asarray(held), held_value)  # still readable, unchanged
    assert not np.array_equal(alias.cpu().numpy(), previous)  # the alias sees the update
    torch.testing.assert_close(alias.cpu(), second.detach().cpu(), rtol=0, atol=0)


def test_backward_inside_a_compiled_function_runs_eagerly_without_dynamo_in_jax():
    """Dynamo runs ``loss.backward()`` eagerly (a graph break). The autograd engine then calls
    torchlax's ops, whose Python frames (dispatch, lowerings, JAX) Dynamo must leave alone:
    it used to try to compile them and failed inside ml_dtypes."""

    def fn(w):
        loss = (w * w).sum()
        loss.backward()
        return w.grad * 3

    with torchlax_core.enable():
        w = torch.arange(4.0).to("jax").requires_grad_()
        out = torch.compile(fn, backend="torchlax")(w)
    torch.testing.assert_close(out.cpu(), torch.arange(4.0) * 6)


SCHEDULERS = {
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "cosine": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4),
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1 / (1 + epoch)),
}


def _make_one_graph_step(model, optimizer, scheduler=None):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        loss = loss.detach()  # the graph hands out no tensor whose grad_fn backward consumed
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss

    return step


def _make_canonical_step(model, optimizer, scheduler):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss  # alive across opt.step(), undetached: an output of the backward's graph

    return step


def _assert_behaves_as_eager_loss(loss, expected):
    """The returned loss is what eager PyTorch returns after its backward, but for the name of
    its ``grad_fn``: it requires grad, is no leaf and no view, reads back and prints its value,
    detaches, and every backward through it raises PyTorch's own error."""
    for t in (loss, expected):
        assert t.requires_grad and t.grad_fn is not None
        assert not t.is_leaf and t._base is None
    assert type(loss.grad_fn).__name__ == "FreedGraphBackward"
    assert loss.item() == pytest.approx(expected.item(), abs=1e-10)
    assert f"{expected.item():.4f}" in repr(loss) and "grad_fn=<FreedGraphBackward>" in repr(loss)
    detached = loss.detach()
    assert not detached.requires_grad and detached.grad_fn is None
    assert detached.item() == loss.item()
    for backpropagate in (lambda t: t.backward(), lambda t: (t * 2 + 1).backward()):
        with pytest.raises(RuntimeError) as eager_error:
            backpropagate(expected)
        with pytest.raises(type(eager_error.value)) as error:
            backpropagate(loss)
        assert str(error.value) == str(eager_error.value)


# Plain SGD has no state for its first step to create, so every step runs the same two programs
# (SGD with momentum compiles a first optimizer step, which makes the buffers, apart).
CANONICAL_OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=1e-2),
    "adamw": OPTIMIZERS["adamw"],
}
_CANONICAL = [("adamw", True), ("adamw", False), ("sgd", True)]


@pytest.mark.parametrize(
    "name, on_jax",
    _CANONICAL,
    ids=[f"{n}-{'torchlax' if j else 'cpu'}" for n, j in _CANONICAL],
)
def test_the_canonical_step_is_two_programs_and_matches_eager(name, on_jax):
    """The issue's step, ``return loss`` after ``opt.step()`` undetached: Dynamo traces
    ``loss.backward()`` (``trace_autograd_ops``, inside the backend's own calls only), and the
    loss, which the optimizer's graph break makes an output of the graph that ran its backward,
    is handed out detached with a ``grad_fn`` that raises (``_spent_outputs``) instead of
    Dynamo restarting the capture. Forward with backward is one XLA program, the optimizer
    update another, nothing else runs per step; a tensor LR changed by a scheduler at every step
    compiles nothing after the first step; losses and parameters match eager PyTorch."""
    x, y = _data()
    scheduler = SCHEDULERS["lambda"]
    eager_model = _model()
    eager_opt = CANONICAL_OPTIMIZERS[name](eager_model.parameters())
    eager_opt.param_groups[0]["lr"] = torch.tensor(eager_opt.param_groups[0]["lr"])
    eager_step = _make_canonical_step(eager_model, eager_opt, scheduler(eager_opt))
    with torchlax_core.enable():
        model = _model().to("jax") if on_jax else _model()
        opt = CANONICAL_OPTIMIZERS[name](model.parameters())
        opt.param_groups[0]["lr"] = torch.tensor(opt.param_groups[0]["lr"])
        step = torch.compile(_make_canonical_step(model, opt, scheduler(opt)), backend="torchlax")
        cx, cy = (x.to("jax"), y.to("jax")) if on_jax else (x, y)
        lrs, first_calls, graphs = set(), None, None
        for i in range(STEPS):
            expected = eager_step(x, y)
            loss = step(cx, cy)
            assert type(loss) is (torchlax_core.Tensor if on_jax else torch.Tensor)
            torch.testing.assert_close(
                loss.detach().cpu(), expected.detach(), atol=1e-10, rtol=1e-10, msg=f"step {i}"
            )
            lrs.add(float(opt.param_groups[0]["lr"]))
            if i == 0:
                first_calls = dict(counters)
                graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-10, rtol=1e-10)
        _assert_behaves_as_eager_loss(loss, expected)
    assert len(lrs) == STEPS  # the scheduler changed the LR at every step
    assert counters["eager_nodes"] == 0, dict(counters)
    # Forward + backward, the optimizer update, and nothing else: no AOT backward graph.
    assert counters["graphs"] == counters["xla_programs"] == 2, dict(counters)
    assert dict(counters) == first_calls  # nothing compiles after the first steps
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert not torch._dynamo.config.trace_autograd_ops  # set only while the step ran


def test_an_alias_of_the_returned_loss_stays_as_eagerly():
    """Beside the loss, a detached alias of it and a view of it, all alive across
    ``opt.step()``: the alias stays detached (no ``grad_fn``), the view has a ``grad_fn`` that
    raises, as eagerly."""

    def make(model, optimizer):
        def step(x, y):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            shown, viewed = loss.detach(), loss.view(1)
            optimizer.step()
            return loss, shown, viewed

        return step

    x, y = _data()
    eager_model = _model()
    expected = make(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1))(x, y)
    model = _model()
    got = torch.compile(
        make(model, torch.optim.SGD(model.parameters(), lr=0.1)), backend="torchlax"
    )(x, y)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.detach(), e.detach(), atol=1e-10, rtol=1e-10)
        assert g.requires_grad == e.requires_grad and (g.grad_fn is None) == (e.grad_fn is None)
    # (Eagerly ``shown`` also shares the loss's storage; this backend's programs return outputs
    # that alias one another as separate arrays, with or without a consumed loss.)
    for viewed in (expected[2], got[2]):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            viewed.sum().backward()
    assert counters["graphs"] == counters["xla_programs"] == 2, dict(counters)


def _backward_then_return_the_loss(w, x):
    with torch.enable_grad():  # the caller may be in no_grad; the loss still requires grad
        loss = (w * x).sum()
        loss.backward()
    return loss


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_a_loss_returned_from_a_single_graph_behaves_as_eagerly(grad_mode):
    """Without an optimizer (one graph, ``fullgraph=True``), under the caller's grad mode
    either way: the loss comes back requiring grad, with a ``grad_fn`` that raises, as
    eagerly; the gradient is accumulated as eagerly."""
    x = torch.randn(3)
    results = []
    for fn in (
        _backward_then_return_the_loss,
        torch.compile(_backward_then_return_the_loss, backend="torchlax", fullgraph=True),
    ):
        w = torch.linspace(-1, 1, 3, requires_grad=True)
        with torch.set_grad_enabled(grad_mode):
            loss = fn(w, x)
        results.append((loss, w.grad))
    (expected, expected_grad), (loss, grad) = results
    torch.testing.assert_close(grad, expected_grad)
    _assert_behaves_as_eager_loss(loss, expected)
    assert counters["graphs"] == counters["xla_programs"] == 1, dict(counters)


def test_other_backends_still_restart_at_the_consumed_loss():
    """The loss hand-out is torchlax's only: after a torchlax canonical step in the same
    process, the same step compiled with ``aot_eager`` and ``trace_autograd_ops`` on is
    captured as Dynamo always does it (a restart with a graph break at ``backward()``, the loss
    a ``CompiledFunctionBackward`` output)."""
    x, y = _data()
    with torchlax_core.enable():
        model = _model().to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))
        scheduler = SCHEDULERS["step"](opt)
        loss = torch.compile(_make_canonical_step(model, opt, scheduler), backend="torchlax")(
            x.to("jax"), y.to("jax")
        )
        assert type(loss.grad_fn).__name__ == "FreedGraphBackward"
    torch._dynamo.utils.counters.clear()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))
    scheduler = SCHEDULERS["step"](opt)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        loss = torch.compile(_make_canonical_step(model, opt, scheduler), backend="aot_eager")(x, y)
    assert type(loss.grad_fn).__name__ == "CompiledFunctionBackward"
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert any("autograd.grad consumed returned tensor's grad_fn" in b for b in breaks), breaks


def _recording_backend(seen: list):
    def backend(gm, example_inputs):
        seen.append(torch._dynamo.config.trace_autograd_ops)
        return gm.forward

    return backend


def _backward_then_double(w):
    (w * w).sum().backward()
    return w.grad * 2


def test_other_backends_capture_with_the_option_as_the_user_left_it():
    """After a torchlax step, a function compiled with another backend in the same process is
    captured with ``trace_autograd_ops`` off: its ``backward()`` still breaks the graph."""
    x, y = _data()
    with torchlax_core.enable():
        model = _model().to("jax")
        step = torch.compile(
            _make_one_graph_step(model, OPTIMIZERS["sgd_loop"](model.parameters())),
            backend="torchlax",
        )
        step(x.to("jax"), y.to("jax"))
    seen = []
    other = torch.compile(_backward_then_double, backend=_recording_backend(seen))
    w = torch.arange(3.0, requires_grad=True)
    torch.testing.assert_close(other(w), torch.arange(3.0) * 4)
    assert seen and not any(seen)
    assert len(seen) == 2  # before and after the backward(): the graph broke there


def test_the_option_is_this_threads_only():
    """Dynamo's configuration is per thread: while a torchlax-compiled function runs (and has
    the option on) in one thread, another thread's captures see it off."""
    entered, done = threading.Event(), threading.Event()
    on_here = []

    @torch._dynamo.disable
    def wait_for_the_other_thread():
        on_here.append(torch._dynamo.config.trace_autograd_ops)
        entered.set()
        assert done.wait(timeout=60)

    def torchlax_fn(t):
        t = t + 1
        wait_for_the_other_thread()
        return t * 2

    seen = []

    def other_thread():
        assert entered.wait(timeout=60)
        try:
            torch.compile(_backward_then_double, backend=_recording_backend(seen))(
                torch.arange(3.0, requires_grad=True)
            )
        finally:
            done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    result = torch.compile(torchlax_fn, backend="torchlax")(torch.ones(2))
    thread.join()
    torch.testing.assert_close(result, torch.full((2,), 4.0))
    assert on_here == [True]  # on in the torchlax call's thread
    assert seen and not any(seen)


def _rich_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def _make_rich_step(model, optimizer, scheduler):
    """Gradient accumulation over two micro-batches, a no_grad block, clip_grad_norm_, a
    BatchNorm in train mode and an LR scheduler, in one step."""

    def step(x, y):
        optimizer.zero_grad()
        for xb, yb in zip(x.chunk(2), y.chunk(2), strict=True):
            loss = F.cross_entropy(model(xb), yb) / 2
            loss.backward()
        with torch.no_grad():
            weight_norm = sum(p.detach().square().sum() for p in model.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        return loss.detach(), weight_norm, grad_norm

    return step


@pytest.mark.parametrize(
    ("on_jax", "schedule"),
    [(False, "step"), (True, "cosine"), (True, "lambda")],
    ids=["cpu-steplr", "torchlax-cosine", "torchlax-lambda"],
)
def test_step_with_accumulation_clipping_batchnorm_and_scheduler(on_jax, schedule):
    """Matches eager PyTorch over 5 steps, and the LR the scheduler changes (a tensor, as
    PyTorch recommends for compiled optimizers) is an input: nothing compiles after step 2."""
    x, y = _data()
    eager_model = _rich_model()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=torch.tensor(0.1), momentum=0.9)
    eager_step = _make_rich_step(eager_model, eager_opt, SCHEDULERS[schedule](eager_opt))
    with torchlax_core.enable():
        model = _rich_model().to("jax") if on_jax else _rich_model()
        opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1), momentum=0.9)
        step = torch.compile(
            _make_rich_step(model, opt, SCHEDULERS[schedule](opt)), backend="torchlax"
        )
        cx, cy = (x.to("jax"), y.to("jax")) if on_jax else (x, y)
        tol = dict(atol=1e-10, rtol=1e-10)
        lrs = set()
        for i in range(STEPS):
            expected = eager_step(x, y)
            got = step(cx, cy)
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g.cpu(), e, **tol, msg=f"step {i}")
            lrs.add(float(opt.param_groups[0]["lr"]))
            if i == 1:
                first_calls = dict(counters)
                graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for (name, p), q in zip(
            model.state_dict().items(), eager_model.state_dict().values(), strict=True
        ):
            torch.testing.assert_close(p.cpu(), q, **tol, msg=name)  # BatchNorm's running stats too
    assert len(lrs) >= 3  # the scheduler did change the LR
    assert counters["eager_nodes"] == 0, dict(counters)
    assert dict(counters) == first_calls  # a new LR compiles nothing
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_dropout_draws_fresh_masks_each_step_reproducibly():
    """Dropout's masks come from torch's generator through one key per call: different at every
    step, the same again after the same torch.manual_seed."""

    def run():
        with torchlax_core.enable():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(6, 64), nn.Dropout(0.5)).to("jax")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)

            def step(x):
                opt.zero_grad()
                hidden = model(x)
                hidden.square().mean().backward()
                opt.step()
                return hidden.detach() == 0

            compiled = torch.compile(step, backend="torchlax")
            x = torch.ones(4, 6).to("jax")
            torch.manual_seed(1)
            return [compiled(x).cpu() for _ in range(3)]

    first, again = run(), run()
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert 0.3 < first[0].double().mean() < 0.7


@pytest.mark.slow
def test_compiled_autograd_step_matches_eager():
    """PyTorch's compiled autograd (loss.backward() captured as a graph too) with this backend."""
    x, y = _data()
    eager_model = _model()
    eager_step = _make_step(
        eager_model, OPTIMIZERS["sgd_momentum_nesterov_wd"](eager_model.parameters())
    )
    with torchlax_core.enable():
        model = _model().to("jax")
        step = torch.compile(
            _make_step(model, OPTIMIZERS["sgd_momentum_nesterov_wd"](model.parameters())),
            backend="torchlax",
        )
        with torch._dynamo.config.patch(compiled_autograd=True):
            for i in range(3):
                torch.testing.assert_close(
                    step(x.to("jax"), y.to("jax")).cpu(),
                    eager_step(x, y),
                    atol=1e-10,
                    rtol=1e-10,
                    msg=f"step {i}",
                )
        for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-10, rtol=1e-10)
    assert counters["eager_nodes"] == 0, dict(counters)
