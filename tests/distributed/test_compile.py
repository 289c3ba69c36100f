"""A sharded model under torch.compile(backend="torchlax")."""

import pytest
from _multidevice import run_on_devices

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow


def test_torch_compile_runs_a_sharded_model():
    run_on_devices("""
        import copy
        from _model import TinyTransformer, loss_fn

        mesh = D.make_mesh((2, 4), ("data", "model"))
        torch.manual_seed(0)
        reference = TinyTransformer()
        tokens = torch.randint(0, 64, (8, 8))
        targets = torch.randint(0, 64, (8, 8))
        ref_loss = loss_fn(reference, tokens, targets)
        ref_grads = torch.autograd.grad(ref_loss, list(reference.parameters()))

        with torchlax_core.enable(), D.mesh_placement(mesh):
            model = copy.deepcopy(reference).to("jax")
            D.shard(model, mesh, D.megatron_rules("model"))
            tk = D.shard(tokens.to("jax"), mesh, P("data"))
            tg = D.shard(targets.to("jax"), mesh, P("data"))
            compiled = torch.compile(model, backend="torchlax")
            logits = compiled(tk)
            assert len(logits.jax().devices()) == 8, logits.jax().sharding
            torch.testing.assert_close(logits.detach().cpu(), reference(tokens).detach(),
                                       atol=1e-5, rtol=1e-5)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tg.reshape(-1))
            loss.backward()
        for (name, p), g in zip(model.named_parameters(), ref_grads):
            torch.testing.assert_close(p.grad.cpu(), g, atol=1e-5, rtol=1e-4, msg=name)
        print("ok")
    """)
