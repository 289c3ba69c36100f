"""What libraries ask of the ``jax`` device: ``torch.jax``'s device-module functions, and
importing torchlax leaving CPU programs (DataLoader pinning) unchanged; DataLoader workers
forked after JAX started raise a clear error instead of crashing."""

from __future__ import annotations

import subprocess
import textwrap

import fresh_python
import torch
import torchlax_core


def _fresh(code: str) -> subprocess.CompletedProcess:
    return fresh_python.run(["-c", textwrap.dedent(code)], timeout=300)


def test_dataloader_pin_memory_over_cpu_tensors_with_torchlax_imported():
    result = _fresh("""
        import torch, torchlax_core
        from torch.utils.data import DataLoader, TensorDataset
        assert not torch.accelerator.is_available()
        data = TensorDataset(torch.arange(8.0).reshape(4, 2))
        batches = [b[0] for b in DataLoader(data, batch_size=2, pin_memory=True)]
        assert all(b.device.type == "cpu" for b in batches)
        assert torch.equal(torch.cat(batches), torch.arange(8.0).reshape(4, 2))
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_device_module_maps_to_jax():
    import jax

    torchlax_core.default_env()
    assert torch.jax.device_count() == len(jax.devices())
    torch.jax.manual_seed(7)
    a = torch.randn(4, device="jax")
    torch.jax.manual_seed(7)
    b = torch.randn(4, device="jax")
    assert torch.equal(a.cpu(), b.cpu())
    before = torch.jax.memory_allocated()
    big = torch.zeros(1 << 16, device="jax")  # 256 KiB
    torch.jax.synchronize()
    assert torch.jax.memory_allocated() - before >= big.numel() * 4
    assert torch.jax.memory_allocated("jax:0") == torch.jax.memory_allocated(0)


def test_dataloader_worker_creating_jax_tensors_raises_clearly():
    result = _fresh("""
        import torch, torchlax_core
        from torch.utils.data import DataLoader, Dataset

        class OnJax(Dataset):
            def __len__(self):
                return 2

            def __getitem__(self, i):
                return torch.ones(2, device="jax") * i

        torch.ones(1, device="jax").sum().item()  # JAX has started in the parent
        try:
            list(DataLoader(OnJax(), batch_size=2, num_workers=1))
        except RuntimeError as exc:
            print("raised", "forked after JAX had started" in str(exc))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "raised True"


def _autocast_run(device, model, x, target):
    with torch.autocast(device, dtype=torch.bfloat16):
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, target)
    loss.backward()
    return out, loss


def test_autocast_jax_forward_and_training_step_match_cpu_autocast():
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, target = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 0, 1])
    on_jax = copy.deepcopy(model).to("jax")
    out_cpu, loss_cpu = _autocast_run("cpu", model, x, target)
    out_jax, loss_jax = _autocast_run("jax", on_jax, x.to("jax"), target.to("jax"))
    # PyTorch's CPU policy: products in bfloat16, the loss in float32.
    assert out_jax.dtype == out_cpu.dtype == torch.bfloat16
    assert loss_jax.dtype == loss_cpu.dtype == torch.float32
    torch.testing.assert_close(out_jax.cpu(), out_cpu, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(loss_jax.cpu(), loss_cpu, atol=2e-2, rtol=2e-2)
    for p_jax, p_cpu in zip(on_jax.parameters(), model.parameters(), strict=True):
        assert p_jax.grad.dtype == torch.float32
        torch.testing.assert_close(p_jax.grad.cpu(), p_cpu.grad, atol=2e-2, rtol=5e-2)
    torch.optim.SGD(on_jax.parameters(), lr=0.1).step()
    with torch.autocast("jax", enabled=False):  # disabled: float32 throughout
        assert on_jax(x.to("jax")).dtype == torch.float32


def test_data_ptr_tells_storages_apart_as_pytorch():
    with torchlax_core.enable():
        base = torch.arange(12.0, device="jax").reshape(3, 4)
        other = torch.zeros(3, 4, device="jax")
        row = base[1]
        as_int = base.view(torch.int32)
    assert base.data_ptr() != 0 and base.data_ptr() != other.data_ptr()
    assert row.data_ptr() == base.data_ptr() + 4 * base.element_size()
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert as_int.data_ptr() == base.data_ptr()
    assert base.untyped_storage().nbytes() == 48


def test_save_pretrained_round_trip_of_a_model_on_jax(tmp_path):
    import pytest

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16, tie_word_embeddings=True
    )
    torch.manual_seed(0)
    cpu_model = transformers.GPT2LMHeadModel(config).eval()
    with torchlax_core.enable():
        model = transformers.GPT2LMHeadModel(config).eval()
        model.load_state_dict(cpu_model.state_dict())
        model.to("jax")
        model.save_pretrained(tmp_path)  # safetensors: finds the tied weights by data_ptr
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    for name, tensor in cpu_model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, cpu_model(ids).logits)
