"""torch.compile(step, backend="torchlax") over a step with effects beyond its parameters: a
tensor it writes that is no parameter (``counter.add_(1)``), a leaf that is no parameter of a
module given a ``.grad`` by ``loss.backward()`` (on the model's device, or a CPU leaf moved to
``jax`` in the loss), a module's backward hook, and a graph break between the forward and
``loss.backward()``.

Dynamo replays writes into tensors it does not own and traces ``.grad`` accumulation into the
leaves it knows; the backward hook and the graph break both put the loss's autograd graph
partly in an earlier graph, which the traced backward (``trace_autograd_ops``, on inside this
backend's calls) cannot follow: before ``torchlax_dynamo._earlier_graphs`` such a step gave no
parameter a ``.grad`` and silently did not train; the CPU leaf's gradient crosses devices, and
Dynamo's fake run of that traced backward aborted the process. Each case: 3 calls, on CPU tensors and on
torchlax Tensors, against the same step run eagerly on the CPU (float64, 1e-10).
"""

import pytest
import torch
import torch.nn.functional as F
import torchlax
from torch import nn

pytestmark = pytest.mark.usefixtures("float64_default")


def _halve_grad_input(module, grad_input, grad_output):
    return tuple(None if g is None else g * 0.5 for g in grad_input)


def _setup(effect: str, device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    with torchlax.enable():
        model = model.to(device)
        counter = torch.zeros((), device=device)
        w = torch.ones(3, device=device, requires_grad=True)  # no module's parameter
        if effect == "cpu-leaf-moved":
            w = torch.ones(3, requires_grad=True)  # on the CPU, whatever the model's device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if effect == "backward-hook":
        model[2].register_full_backward_hook(_halve_grad_input)

    def step(x, y):
        opt.zero_grad()
        out = model(x)
        if effect == "leaf-grad":
            out = out * w
        if effect == "graph-break":
            torch._dynamo.graph_break()
        loss = F.cross_entropy(out, y)
        if effect == "cpu-leaf-moved":
            loss = loss + (w * 2).sum().to(out.device)
        loss.backward()
        opt.step()
        if effect == "counter":
            counter.add_(1)
        return loss.detach()

    return step, model, counter, w


# Dynamo itself replays the counter and traces the leaf's .grad; CPU tensors take the torchlax
# Tensors' path after promotion, so those two cases run on jax tensors only.
@pytest.mark.parametrize(
    ("effect", "device"),
    [
        ("counter", "jax"),
        ("leaf-grad", "jax"),
        ("backward-hook", "cpu"),
        ("backward-hook", "jax"),
        ("graph-break", "cpu"),
        ("graph-break", "jax"),
        ("cpu-leaf-moved", "jax"),  # (before: the process aborted while Dynamo traced it)
    ],
)
def test_a_steps_effects_are_eager_pytorchs_after_three_calls(effect, device):
    torch.manual_seed(1)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    ref_step, ref_model, ref_counter, ref_w = _setup(effect, "cpu")
    step, model, counter, w = _setup(effect, device)
    compiled = torch.compile(step, backend="torchlax")
    with torchlax.enable():
        cx, cy = x.to(device), y.to(device)
    for _ in range(3):
        want = ref_step(x, y)
        got = compiled(cx, cy)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    for (name, r), p in zip(ref_model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-10, atol=1e-10, msg=name)
        torch.testing.assert_close(p.grad.cpu(), r.grad, rtol=1e-10, atol=1e-10, msg=name)
    torch.testing.assert_close(counter.cpu(), ref_counter, rtol=0, atol=0)
    if effect in ("leaf-grad", "cpu-leaf-moved"):
        torch.testing.assert_close(w.grad.cpu(), ref_w.grad, rtol=1e-10, atol=1e-10)
    else:
        assert w.grad is None
