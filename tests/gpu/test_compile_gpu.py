"""torch.compile(backend="torchlax") on CUDA tensors: no copies in or out, training works."""

import copy

import gpu_support
import pytest
import torch
import torchlax_dynamo
from gpu_support import jax_gpu, pointer
from torchlax_dynamo import _dlpack, _program

pytestmark = gpu_support.MARKS


@pytest.fixture
def crossings(monkeypatch):
    """Record every tensor crossing between torch and XLA in the compiled programs."""
    seen = {"in": [], "out": []}
    to_jax, to_torch = _dlpack.torch_to_jax, _program.jax_to_torch

    def torch_to_jax(tensor):
        array = to_jax(tensor)
        seen["in"].append((tensor.device, tensor.data_ptr(), array.devices(), pointer(array)))
        return array

    def jax_to_torch(array, **kwargs):
        tensor = to_torch(array, **kwargs)
        seen["out"].append((tensor.device, tensor.data_ptr(), array.devices(), pointer(array)))
        return tensor

    monkeypatch.setattr(_dlpack, "torch_to_jax", torch_to_jax)
    monkeypatch.setattr(_program, "jax_to_torch", jax_to_torch)
    return seen


def _assert_shared(records):
    assert any(device.type == "cuda" for device, *_ in records), records
    for device, address, jax_devices, jax_address in records:
        if device.type == "cuda":
            assert jax_devices == {jax_gpu(device.index)}, (device, jax_devices)
        assert address == jax_address, f"a tensor on {device} was copied between torch and XLA"


def test_inputs_and_outputs_cross_without_copies(crossings):
    f = torch.compile(lambda x, y: (x * 2 + y).sin(), backend="torchlax", fullgraph=True)
    x = torch.randn(128, 64, device="cuda")
    y = torch.randn(64, device="cuda")
    out = f(x, y)
    assert type(out) is torch.Tensor and out.device == torch.device("cuda", 0)
    torch.testing.assert_close(out, (x * 2 + y).sin())
    _assert_shared(crossings["in"])
    _assert_shared(crossings["out"])
    assert out.data_ptr() in {address for _, address, _, _ in crossings["out"]}
    assert {address for _, address, _, _ in crossings["in"]} == {x.data_ptr(), y.data_ptr()}


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 64),
        torch.nn.LayerNorm(64),
        torch.nn.Linear(64, 4),
    ).cuda()


def test_training_with_loss_backward_matches_cuda_eager(crossings):
    eager = _mlp()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="torchlax")
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_compiled = torch.optim.SGD(compiled_model.parameters(), lr=0.1)
    g = torch.Generator("cuda").manual_seed(0)
    for _ in range(3):
        x = torch.randn(16, 32, device="cuda", generator=g)
        y = torch.randn(16, 4, device="cuda", generator=g)
        losses = []
        for model, opt in ((eager, opt_eager), (compiled, opt_compiled)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert q.device == torch.device("cuda", 0) and q.grad.device == q.device, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)
    assert torchlax_dynamo.counters["graphs"] >= 2  # a forward and a backward program
    _assert_shared(crossings["in"])
    _assert_shared(crossings["out"])


def test_buffers_written_in_place_on_the_gpu():
    bn = torch.nn.BatchNorm1d(8).cuda().train()
    reference = copy.deepcopy(bn)
    compiled = torch.compile(bn, backend="torchlax")
    x = torch.randn(32, 8, device="cuda")
    torch.testing.assert_close(compiled(x), reference(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_mean, reference.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, reference.running_var, rtol=1e-5, atol=1e-6)
    assert bn.running_mean.device.type == "cuda"
