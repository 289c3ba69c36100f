"""A learning rate of 0 with gradients of 0, compiled: the optimizers agree with eager PyTorch.

Compiled steps (``torchlax.jit`` and ``torch.compile(backend="torchlax")``) run the optimizers
with ``capturable=True``; torch 2.14's single-tensor capturable Adam divided 0 by 0 there
(``lr == 0``, a second moment of 0), so a Hugging Face style linear warmup over a LoRA adapter
(zero-initialised B: A's gradient is 0) turned the parameters to NaN after the first step,
where eager PyTorch on the CPU stays finite (issue 37, item 4; ``torchlax_core._capturable_adam``).
Every optimizer with a capturable path is checked, each against the same steps eagerly on the
CPU: parameters and optimizer state after every step.
"""

import copy

import pytest
import torch
import torchlax
from torch import nn

STEPS = 4

OPTIMIZERS = {
    "adam": lambda p, lr: torch.optim.Adam(p, lr=lr),
    "adam_loop": lambda p, lr: torch.optim.Adam(p, lr=lr, foreach=False),
    "adam_amsgrad": lambda p, lr: torch.optim.Adam(p, lr=lr, amsgrad=True),
    "adam_maximize_wd": lambda p, lr: torch.optim.Adam(p, lr=lr, maximize=True, weight_decay=0.1),
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01),
    "nadam": lambda p, lr: torch.optim.NAdam(p, lr=lr),
    "nadam_decoupled": lambda p, lr: torch.optim.NAdam(
        p, lr=lr, weight_decay=0.1, decoupled_weight_decay=True
    ),
    "radam": lambda p, lr: torch.optim.RAdam(p, lr=lr),
    "adamax": lambda p, lr: torch.optim.Adamax(p, lr=lr),
    "asgd": lambda p, lr: torch.optim.ASGD(p, lr=lr),
    "rprop": lambda p, lr: torch.optim.Rprop(p, lr=lr),
}


def _warmup(step: int) -> float:
    return step / (STEPS - 1)  # 0 at the first step, as transformers' linear warmup


class _Masked(nn.Module):
    """A weight whose masked entries never get a gradient (their second moment stays 0)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 4))
        self.register_buffer("mask", torch.tensor([1.0, 0.0, 1.0, 0.0]))

    mask: torch.Tensor

    def forward(self, x):
        return ((x @ (self.w * self.mask).T) ** 2).mean()


def _run(model, opt_name: str, mode: str | None, device: str):
    lr = torch.tensor(1.0) if mode == "backend" else 1.0
    opt = OPTIMIZERS[opt_name](model.parameters(), lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup)

    def step(x):
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        return loss.detach()

    if mode == "jit":
        step = torchlax.jit(step)
    elif mode == "backend":
        step = torch.compile(step, backend="torchlax")
    x = torch.linspace(-1, 1, 8).reshape(2, 4).to(device)
    history = []
    for _ in range(STEPS):
        loss = step(x)
        sched.step()  # outside the compiled step: the backend compiles it as any Python
        state = [t.detach().cpu().clone() for t in _state_tensors(model, opt)]
        history.append((loss.detach().cpu(), state))
    return history


def _state_tensors(model, opt):
    yield from model.parameters()
    for p in model.parameters():
        for value in opt.state[p].values():
            if isinstance(value, torch.Tensor):
                yield value


# Float64: compiled optimizers compute bias corrections from the tensor step count (the default
# dtype), eagerly from Python floats; in float64 the two agree to 1e-10 (test_training_step.py).
@pytest.mark.usefixtures("float64_default")
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["jit", "backend"])
def test_zero_lr_with_zero_gradients_agrees_with_eager(mode, opt_name):
    model = _Masked()
    expected = _run(copy.deepcopy(model), opt_name, None, "cpu")
    with torchlax.enable():
        actual = _run(copy.deepcopy(model).to("jax"), opt_name, mode, "jax")
    before = model.w.detach()
    for k, ((loss, state), (loss_e, state_e)) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(loss, loss_e, rtol=1e-10, atol=1e-12)
        assert len(state) == len(state_e)
        for got, want in zip(state, state_e, strict=True):
            assert torch.isfinite(got).all(), (mode, opt_name, k, got)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # The first step's learning rate is 0: the parameters are left exactly as they were (not by
    # Rprop, whose step sizes start at lr and are clamped to at least step_sizes[0], 1e-6).
    if opt_name != "rprop":
        assert torch.equal(actual[0][1][0], before) and torch.equal(expected[0][1][0], before)


def _lora_losses(device: str, mode: str | None) -> list[float]:
    torch.manual_seed(0)
    base = nn.Linear(16, 16)
    base.requires_grad_(False)
    # LoRA: A random, B zero-initialised (peft's default), rank 4.
    lora_a = nn.Linear(16, 4, bias=False)
    lora_b = nn.Linear(4, 16, bias=False)
    nn.init.zeros_(lora_b.weight)
    head = nn.Linear(16, 5)
    model = nn.ModuleDict({"base": base, "a": lora_a, "b": lora_b, "head": head}).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = torch.tensor(5e-2) if mode == "backend" else 5e-2
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warmup, total = 2, 6

    def schedule(step: int) -> float:  # transformers.get_linear_schedule_with_warmup
        if step < warmup:
            return step / warmup
        return max(0.0, (total - step) / (total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    x = torch.randn(8, 16).to(device)
    y = torch.randint(0, 5, (8,)).to(device)

    def step(x, y):
        opt.zero_grad()
        h = model["base"](x) + 2.0 * model["b"](model["a"](x))
        loss = nn.functional.cross_entropy(model["head"](torch.tanh(h)), y)
        loss.backward()
        opt.step()
        return loss.detach()

    if mode == "jit":
        step = torchlax.jit(step)
    elif mode == "backend":
        step = torch.compile(step, backend="torchlax")
    losses = []
    for _ in range(total):
        losses.append(float(step(x, y)))
        sched.step()
    return losses


@pytest.mark.parametrize("mode", ["jit", "backend"])
def test_lora_with_linear_warmup_stays_finite_and_agrees_with_eager(mode):
    expected = _lora_losses("cpu", None)
    with torchlax.enable():
        actual = _lora_losses("jax", mode)
    assert all(map(torch.isfinite, torch.tensor(actual))), actual
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=1e-5, atol=1e-6)
