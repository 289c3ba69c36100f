"""Inputs moved with ``.to("jax")`` (not sharded by hand) combine with mesh-sharded weights.

PyTorch users move a batch with ``ids.to(device)``; such a tensor sits on JAX's default device
and must work with weights laid out over a mesh, eagerly, under ``torchlax.jit`` and under
``torch.compile``, with no ``mesh_placement`` around the code.
"""

import pytest
from _multidevice import run_on_devices

# Fresh Python processes with 8 simulated devices: seconds, not milliseconds.
pytestmark = pytest.mark.slow


def test_megatron_and_fsdp_models_run_and_train_on_unsharded_inputs():
    run_on_devices("""
        import copy
        import torchlax
        from _model import TinyTransformer, loss_fn

        mesh = D.make_mesh((2, 4), ("data", "model"))
        torch.manual_seed(0)
        reference = TinyTransformer(layers=1)
        tokens = torch.randint(0, 64, (4, 16))
        targets = torch.randint(0, 64, (4, 16))
        ref_logits = reference(tokens).detach()

        def sgd_reference():
            ref = copy.deepcopy(reference)
            loss = loss_fn(ref, tokens, targets)
            loss.backward()
            torch.optim.SGD(ref.parameters(), lr=0.5).step()
            return loss.item(), {n: p.detach() for n, p in ref.named_parameters()}

        ref_loss, ref_after = sgd_reference()

        # How an unsharded input meets sharded weights hangs on the mode, not on the rules:
        # Megatron's layout in every mode, FSDP's eagerly, where torchlax itself combines the
        # input with each differently laid out weight op by op (under jit and torch.compile
        # GSPMD partitions whatever the layout, and each rules-mode pair costs compilations of
        # its forward and backward over 8 devices).
        cases = [(D.megatron_rules("model"), m) for m in ("eager", "jit", "compile")]
        for rules, mode in cases + [(D.fsdp_rules("data"), "eager")]:
            with torchlax_core.enable():
                model = copy.deepcopy(reference).to("jax")
                D.shard(model, mesh, rules)
                assert len(model.embed_tokens.weight.jax().devices()) == 8
                ids, tg = tokens.to("jax"), targets.to("jax")   # default device, unsharded
                assert len(ids.jax().devices()) == 1
                run = {"eager": model, "jit": torchlax.jit(model),
                       "compile": torch.compile(model, backend="torchlax")}[mode]
                logits = run(ids)
                torch.testing.assert_close(logits.detach().cpu(), ref_logits, atol=1e-5,
                                           rtol=1e-5, msg=f"{mode} forward")
                opt = torch.optim.SGD(model.parameters(), lr=0.5)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tg.reshape(-1))
                loss.backward()
                opt.step()
                assert abs(loss.item() - ref_loss) < 1e-5, (mode, loss.item(), ref_loss)
                for name, p in model.named_parameters():
                    assert len(p.jax().devices()) == 8, (mode, name)   # layout kept
                    torch.testing.assert_close(p.detach().cpu(), ref_after[name], atol=1e-5,
                                               rtol=1e-4, msg=f"{mode} {name}")
        print("ok")
    """)
