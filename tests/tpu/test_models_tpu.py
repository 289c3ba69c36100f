"""The models of tests/models on the TPU, forward and a training step, against the CPU.

Float32 on both sides; compared at the TPU's float32 tolerance (tpu_support: transcendentals
differ by ~1e-4 there). Each comparison records its largest difference (``--junitxml``).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
import torchlax
import tpu_support

pytestmark = tpu_support.MARKS
CASES = tpu_support.model_cases().CASES
built = tpu_support.model_cases().built


def _built(name):
    """The case's model and inputs; torchvision's models skip where it is not installed (a
    TPU VM's image may lack it: its wheel must match torch's version)."""
    if name in ("resnet18", "mobilenet_v3") and importlib.util.find_spec("torchvision") is None:
        pytest.skip(f"{name} needs torchvision, which is not installed")
    return built(CASES[name])


def _on_tpu(tensor: torch.Tensor) -> None:
    assert isinstance(tensor, torchlax.Tensor)
    assert {d.platform for d in tensor.jax().devices()} == {"tpu"}


def _close(actual, expected, tol, record, what):
    actual = actual.detach().cpu()
    expected = expected.detach()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    diff = (actual.double() - expected.double()).abs().max().item()
    record(what, f"{diff:.3g}")
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, msg=what)


def _loss(case, out):
    return case.output(out).float().square().mean()


@pytest.mark.parametrize("name", list(CASES))
def test_forward_under_jit_matches_the_cpu(name, record_property):
    case = CASES[name]
    model, inputs = _built(name)
    with torch.no_grad():
        expected = case.output(model(*inputs))
    with torchlax.enable(), torch.no_grad():
        jmodel = copy.deepcopy(model).to("jax")
        got = case.output(torchlax.jit(jmodel)(*(t.to("jax") for t in inputs)))
    _on_tpu(got)
    _close(got, expected, tpu_support.FORWARD_TOL, record_property, f"{name} logits")


@pytest.mark.parametrize("name", list(CASES))
def test_training_step_under_jit_matches_the_cpu(name, record_property):
    """Two steps of zero_grad, forward, backward, SGD (momentum) as one ``torchlax.jit`` step."""
    case = CASES[name]
    model, inputs = _built(name)
    if name in ("gpt2", "llama", "bert", "vit"):
        model.eval()  # dropout streams differ between devices; batch norm trains below
    else:
        model.train()
    with torchlax.enable():
        jmodel = copy.deepcopy(model).to("jax")
        jinputs = tuple(t.to("jax") for t in inputs)
    results = []
    for m, x, wrap in ((model, inputs, lambda f: f), (jmodel, jinputs, torchlax.jit)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        def step(m=m, x=x, opt=opt):
            opt.zero_grad()
            loss = _loss(case, m(*x))
            loss.backward()
            opt.step()
            return loss.detach()

        run = wrap(step)
        losses = [run() for _ in range(2)]
        results.append((losses, dict(m.named_parameters())))
    (cpu_losses, cpu_params), (tpu_losses, tpu_params) = results
    _on_tpu(tpu_losses[-1])
    for i, (got, expected) in enumerate(zip(tpu_losses, cpu_losses)):
        _close(got, expected, tpu_support.TRAINING_TOL, record_property, f"{name} loss {i}")
    worst = max(
        cpu_params,
        key=lambda k: (tpu_params[k].detach().cpu() - cpu_params[k].detach()).abs().max().item(),
    )
    for key, p in cpu_params.items():
        if key == worst:
            _close(tpu_params[key], p, tpu_support.TRAINING_TOL, record_property, f"{name} {key}")
        else:
            torch.testing.assert_close(
                tpu_params[key].detach().cpu(),
                p.detach(),
                rtol=tpu_support.TRAINING_TOL,
                atol=tpu_support.TRAINING_TOL,
                msg=key,
            )
