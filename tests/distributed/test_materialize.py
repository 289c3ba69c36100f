"""Models built on meta get their weights created directly sharded."""

import pytest
from _multidevice import run_on_devices

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow


def test_materialize_creates_sharded_parameters_without_a_full_copy():
    run_on_devices("""
        import math
        from _model import TinyTransformer

        mesh = D.make_mesh((2, 4), ("data", "model"))
        torch.manual_seed(0)
        model = D.init_on_meta(lambda: TinyTransformer(vocab=64, dim=32, hidden=64))
        assert all(p.device.type == "meta" for p in model.parameters())
        with torchlax_core.enable():
            specs = D.materialize(model, mesh, D.megatron_rules("model", data_axis="data"))
        assert specs["layers.0.attn.q_proj.weight"] == P("model", None)
        for name, p in model.named_parameters():
            assert isinstance(p, torch.nn.Parameter) and isinstance(p, torchlax_core.Tensor), name
            sharding = p.jax().sharding
            assert sharding == NamedSharding(mesh, specs[name]), (name, sharding)
            # each device holds only its shard: never the whole tensor, unless replicated
            expected = tuple(sharding.shard_shape(tuple(p.shape)))
            assert D.shard_shapes(p) == [expected] * 8, name
            if specs[name] != P():
                assert math.prod(expected) < p.numel(), name

        # PyTorch's initialisation (reset_parameters) semantics
        q = model.layers[0].attn.q_proj
        bound = 1 / math.sqrt(32)
        w = q.weight.detach().cpu()
        assert w.abs().max() <= bound and w.std() > bound / 3   # kaiming_uniform(a=sqrt(5))
        assert q.bias.detach().cpu().abs().max() <= bound
        assert torch.equal(model.layers[0].ln1.weight.detach().cpu(), torch.ones(32))
        assert torch.equal(model.norm.bias.detach().cpu(), torch.zeros(32))
        emb = model.embed_tokens.weight.detach().cpu()
        assert abs(emb.std().item() - 1) < 0.1 and abs(emb.mean().item()) < 0.1   # normal_(0, 1)
        # distinct draws per parameter
        assert not torch.equal(w, model.layers[0].attn.k_proj.weight.detach().cpu())

        # the model runs and matches the same weights on the CPU
        tokens = torch.randint(0, 64, (4, 8))
        cpu_model = TinyTransformer(vocab=64, dim=32, hidden=64)
        cpu_model.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
        with torchlax_core.enable(), D.mesh_placement(mesh):
            out = model(D.shard(tokens.to("jax"), mesh, P("data")))
        torch.testing.assert_close(out.detach().cpu(), cpu_model(tokens).detach(), atol=1e-5, rtol=1e-5)
        print("ok")
    """)


def test_materialize_with_an_initializer_and_tied_weights():
    run_on_devices("""
        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(64, 16)
                self.scale = torch.nn.Parameter(torch.empty(16))  # no reset_parameters owner
                self.head = torch.nn.Linear(16, 64, bias=False)
                self.head.weight = self.embed.weight

            def forward(self, x):
                return self.head(self.embed(x) * self.scale)

        mesh = D.make_mesh((8,), ("data",))
        model = D.init_on_meta(Tied)
        try:
            with torchlax_core.enable():
                D.materialize(model, mesh, D.fsdp_rules("data"))
        except ValueError as e:
            assert "scale" in str(e) and "init_fn" in str(e), e
        else:
            raise AssertionError("a parameter without reset_parameters needs init_fn")

        def init(name, t):
            torch.nn.init.normal_(t, std=0.02) if t.ndim > 1 else torch.nn.init.ones_(t)

        with torchlax_core.enable():
            specs = D.materialize(model, mesh, D.fsdp_rules("data"), init, seed=3)
        assert model.head.weight is model.embed.weight
        assert specs["embed.weight"] == P("data")
        assert D.shard_shapes(model.embed.weight) == [(8, 16)] * 8
        assert torch.equal(model.scale.detach().cpu(), torch.ones(16))
        std = model.embed.weight.detach().cpu().std().item()
        assert 0.015 < std < 0.025, std
        print("ok")
    """)
