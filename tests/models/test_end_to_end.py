"""End to end: each model eagerly, under torchlax.jit, torch.compile and export, and training.

Every result is compared with the same model run by eager PyTorch on the CPU.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torchlax
import torchlax_export
from model_cases import CASES, ModelCase, built

pytestmark = pytest.mark.slow


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request) -> ModelCase:
    return CASES[request.param]


def to_jax(model, inputs):
    with torchlax.enable():
        return copy.deepcopy(model).to("jax"), tuple(t.to("jax") for t in inputs)


def close(actual, expected, tol):
    actual = actual.detach()
    actual = actual.cpu() if isinstance(actual, torchlax.Tensor) else actual
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected.detach(), rtol=tol, atol=tol)


def test_forward_eager(case):
    model, inputs = built(case)
    expected = case.output(model(*inputs))
    jmodel, jinputs = to_jax(model, inputs)
    got = case.output(jmodel(*jinputs))
    assert isinstance(got, torchlax.Tensor)
    close(got, expected, case.tolerance)


def test_forward_jit(case):
    model, inputs = built(case)
    expected = case.output(model(*inputs))
    jmodel, jinputs = to_jax(model, inputs)
    jitted = torchlax.jit(jmodel)
    close(case.output(jitted(*jinputs)), expected, case.tolerance)
    close(case.output(jitted(*jinputs)), expected, case.tolerance)  # cached executable


# The float32 forward under torch.compile is checked by test_training_step_torch_compile, whose
# compiled forward is that one (same model, same inputs): here only for models trained in
# another dtype.
@pytest.mark.parametrize(
    "name", [name for name, case in CASES.items() if case.train_dtype != torch.float32]
)
def test_forward_torch_compile(name):
    case = CASES[name]
    model, inputs = built(case)
    expected = case.output(model(*inputs))
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="torchlax")
    got = case.output(compiled(*inputs))
    assert type(got) is torch.Tensor
    close(got, expected, case.tolerance)


def test_forward_export(case, tmp_path):
    model, inputs = built(case)
    expected = case.output(model(*inputs))

    class Logits(torch.nn.Module):  # export a tensor output (HF models return dataclasses)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return case.output(self.inner(x))

    artifact = torchlax_export.export(Logits(model), inputs)
    artifact.save(tmp_path / case.name)
    program = torchlax_export.load(tmp_path / case.name)
    out = program(*[t.numpy() for t in inputs])
    out = out[0] if isinstance(out, list | tuple) else out
    close(torch.from_numpy(np.asarray(out).copy()), expected, case.tolerance)


def _loss(case, out):
    logits = case.output(out)
    return logits.to(torch.promote_types(logits.dtype, torch.float32)).pow(2).mean()


def _grad_tolerance(case):
    # float64 runs agree to rounding (1e-13 after two SGD steps): a tight bound catches
    # real errors that 1e-3 would hide.
    return 1e-9 if case.train_dtype == torch.float64 else 1e-3


# Eager training compiles every op signature of the model (twice: plain, then cached), which
# for MobileNetV3 is ~100 worker-seconds of CI. Its layers' gradients (depthwise convolution,
# hardswish, squeeze-excite pooling) are checked by test_training_step_torch_compile, which
# runs the same backward lowerings; ResNet-18 covers convolutional training eagerly.
EAGERLY_TRAINED = [name for name in CASES if name != "mobilenet_v3"]


# ResNet-18 trains with the eager op cache off: its ~130 op signatures would each compile an
# executable (~12 of its ~35 CPU-seconds here), while the op-by-op lowerings are what its
# convolution and batch-norm gradients check; every op's cached form is checked by the OpInfo
# suite, and the transformers below train through the cache.
UNCACHED = {"resnet18"}


@pytest.mark.parametrize("name", EAGERLY_TRAINED)
def test_training_step(name, monkeypatch):
    case = CASES[name]
    if name in UNCACHED:
        monkeypatch.setattr(torchlax.default_env().config, "op_cache_size", 0)
    model, inputs = built(case, train=True, dtype=case.train_dtype)
    if case.name in ("gpt2", "llama", "bert", "vit"):
        model.eval()  # dropout streams differ between CPU and JAX; batch norm still trains below
    jmodel, jinputs = to_jax(model, inputs)
    results = []
    for m, x in ((model, inputs), (jmodel, jinputs)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            loss = _loss(case, m(*x))
            loss.backward()
            opt.step()
        results.append((loss, dict(m.named_parameters()), dict(m.named_buffers())))
    (cpu_loss, cpu_params, cpu_buffers), (jax_loss, jax_params, jax_buffers) = results
    tol = _grad_tolerance(case)
    close(jax_loss, cpu_loss, tol)
    for name, p in cpu_params.items():
        close(jax_params[name], p, tol)
    for name, b in cpu_buffers.items():
        if b.is_floating_point():
            close(jax_buffers[name], b, tol)


def test_training_step_torch_compile(case):
    """Forward and gradients under torch.compile (one compilation for both checks)."""
    model, inputs = built(case, train=False, dtype=case.train_dtype)
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="torchlax")
    expected, got = model(*inputs), compiled(*inputs)
    assert type(case.output(got)) is torch.Tensor
    if case.train_dtype == torch.float32:  # the forward's own tolerance (else its own test)
        close(case.output(got), case.output(expected), case.tolerance)
    _loss(case, expected).backward()
    _loss(case, got).backward()
    compiled_params = dict(compiled.named_parameters())
    for name, p in model.named_parameters():
        q = compiled_params.get(name) or compiled_params.get(f"_orig_mod.{name}")
        close(q.grad, p.grad, _grad_tolerance(case))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_with_kv_cache_matches_cpu(name):
    case = CASES[name]
    model, (tokens,) = built(case)
    prompt = tokens[:1, :6]
    # Three tokens: the prompt's pass, then two steps on the KV cache (the second reads what a
    # cached step wrote). On the jax device the cache is a bucketed StaticCache
    # (test_bucketed_generate.py), on the CPU transformers' DynamicCache: the same tokens.
    kwargs = dict(max_new_tokens=3, do_sample=False, use_cache=True, pad_token_id=0)
    expected = model.generate(prompt, **kwargs)
    jmodel, (jprompt,) = to_jax(model, (prompt,))
    got = jmodel.generate(jprompt, **kwargs)
    assert got.cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("wrapper", ["torchlax.jit", "torch.compile"])
def test_gpt2_whole_training_step_matches_cpu(wrapper, float64_default):
    """A 2-layer GPT-2 from transformers: zero_grad, forward, backward and AdamW, 3 steps, as
    one compiled step (torchlax.jit: one XLA program; torch.compile: Dynamo's graphs).

    Compiled, torch.optim computes Adam's bias corrections from its tensor step count, which
    has the default dtype: float64 here, so compiled and eager steps agree to rounding."""
    case = CASES["gpt2"]
    model, (tokens,) = built(case, dtype=torch.float64)  # eval(): no dropout streams to match
    jmodel, (jtokens,) = to_jax(model, (tokens,))

    def make_step(m):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

        def step(ids):
            opt.zero_grad()
            logits = m(ids).logits  # (transformers' own loss upcasts to float32 only)
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
            )
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    eager_step = make_step(model)
    torch._dynamo.reset()
    with torchlax.enable():
        step = make_step(jmodel)
        step = (
            torchlax.jit(step)
            if wrapper == "torchlax.jit"
            else torch.compile(step, backend="torchlax")
        )
        for _ in range(3):
            close(step(jtokens), eager_step(tokens), 1e-9)
    params = dict(jmodel.named_parameters())
    for name, p in model.named_parameters():
        close(params[name], p, 1e-9)
    if wrapper == "torchlax.jit":
        assert step.compilations == 2  # the first call's program and the steady one, ahead
