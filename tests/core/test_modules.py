"""nn.Module on torchlax: .to("jax"), state dicts both ways, torch.save, buffers, ties, deepcopy."""

from __future__ import annotations

import copy
import os

import fresh_python
import pytest
import torch
import torch.nn as nn
import torchlax_core
from eager_compare import assert_same, to_jax


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)
    )


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.relu(self.embed(ids)))


def test_to_jax_moves_parameters_and_buffers():
    model = _mlp()
    params = {name: id(p) for name, p in model.named_parameters()}
    model.to("jax")
    for name, p in model.named_parameters():
        assert isinstance(p, torchlax_core.Tensor) and isinstance(p, nn.Parameter)
        assert p.requires_grad and p.is_leaf and p.device.type == "jax"
        assert id(p) == params[name]  # the same Parameter objects, as .to("cuda") keeps them
    for _, b in model.named_buffers():
        assert isinstance(b, torchlax_core.Tensor)
    assert model[1].num_batches_tracked.dtype == torch.int64


def test_forward_matches_cpu_in_eval_mode():
    cpu = _mlp().eval()
    jx = copy.deepcopy(cpu).to("jax")
    x = torch.randn(5, 4)
    assert_same(jx(to_jax(x)), cpu(x), atol=1e-5)


def test_state_dict_round_trips_both_ways():
    cpu = _mlp()
    jx = _mlp(seed=1).to("jax")
    jx.load_state_dict(cpu.state_dict())  # CPU -> jax
    for (name, a), (_, e) in zip(jx.state_dict().items(), cpu.state_dict().items(), strict=True):
        assert isinstance(a, torchlax_core.Tensor), name
        assert_same(a, e)
    back = _mlp(seed=2)
    back.load_state_dict(jx.state_dict())  # jax -> CPU
    for (name, a), (_, e) in zip(back.state_dict().items(), cpu.state_dict().items(), strict=True):
        assert type(a) is torch.Tensor or isinstance(a, nn.Parameter), name
        torch.testing.assert_close(a, e)


def test_torch_save_loads_without_torchlax(tmp_path):
    jx = _mlp().to("jax")
    path = tmp_path / "state.pt"
    torch.save(jx.state_dict(), path)
    expected = {k: v.detach().cpu() for k, v in jx.state_dict().items()}
    torch.save(expected, tmp_path / "expected.pt")
    script = f"""
import sys, torch
state = torch.load({str(path)!r}, weights_only=True)
expected = torch.load({str(tmp_path / "expected.pt")!r}, weights_only=True)
assert "torchlax_core" not in sys.modules, "torchlax was imported"
assert state.keys() == expected.keys()
for k in state:
    assert type(state[k]) is torch.Tensor and state[k].device.type == "cpu", k
    torch.testing.assert_close(state[k], expected[k])
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = fresh_python.run(["-c", script], env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_batchnorm_running_stats_update_in_place():
    cpu = _mlp()
    jx = copy.deepcopy(cpu).to("jax")
    bn = jx[1]
    buffers = (bn.running_mean, bn.running_var, bn.num_batches_tracked)
    ids = [id(b) for b in buffers]
    cpu.train()
    jx.train()
    for step in range(2):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
        cpu[:2](x)
        jx[:2](to_jax(x))
    assert [id(b) for b in (bn.running_mean, bn.running_var, bn.num_batches_tracked)] == ids
    assert_same(bn.running_mean, cpu[1].running_mean, atol=1e-5)
    assert_same(bn.running_var, cpu[1].running_var, atol=1e-5)
    assert_same(bn.num_batches_tracked, cpu[1].num_batches_tracked)


def test_train_and_eval_modes():
    jx = _mlp().to("jax")
    x = to_jax(torch.randn(8, 4))
    jx.eval()
    assert not jx.training and not jx[3].training
    with torch.no_grad():
        assert torch.equal(jx(x).cpu(), jx(x).cpu())  # eval: no dropout, running stats
    jx.train()
    assert jx.training and jx[3].training
    with torch.no_grad():
        assert not torch.equal(jx(x).cpu(), jx(x).cpu())  # train: dropout draws differ


def test_tied_weights_stay_tied():
    model = _TiedLM()
    model.to("jax")
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 1
    ids = to_jax(torch.tensor([1, 2, 3]))
    model(ids).sum().backward()
    cpu = _TiedLM()
    cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    cpu(torch.tensor([1, 2, 3])).sum().backward()
    assert_same(model.embed.weight.grad, cpu.embed.weight.grad, atol=1e-5)


def test_deepcopy_of_jax_model():
    model = _TiedLM().to("jax")
    twin = copy.deepcopy(model)
    assert twin.head.weight is twin.embed.weight
    assert twin.embed.weight is not model.embed.weight
    assert isinstance(twin.embed.weight, nn.Parameter)
    assert isinstance(twin.embed.weight, torchlax_core.Tensor)
    assert_same(twin.embed.weight, model.embed.weight.cpu())
    with torch.no_grad():
        twin.embed.weight.add_(1)  # independent storage
    assert not torch.equal(twin.embed.weight.cpu(), model.embed.weight.cpu())


def test_module_dtype_conversion_on_jax():
    model = _mlp().to("jax")
    weight = model[0].weight
    model.to(torch.float64)
    assert model[0].weight is weight
    assert model[0].weight.dtype == torch.float64
    assert model[0].weight.jax().dtype == "float64"
    model.to("cpu")
    assert type(model[0].weight) is nn.Parameter and model[0].weight.device.type == "cpu"
