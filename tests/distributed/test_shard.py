"""Sharded models equal unsharded ones: eager, under jit, and with the shardings asked for."""

import pytest
from _multidevice import run_on_devices

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow

SETUP = """
    import copy
    from _model import TinyTransformer, loss_fn

    mesh = D.make_mesh((2, 4), ("data", "model"))
    torch.manual_seed(0)
    reference = TinyTransformer()
    tokens = torch.randint(0, 64, (8, 8))
    targets = torch.randint(0, 64, (8, 8))
"""


def test_megatron_eager_forward_and_training_step_equal_unsharded():
    run_on_devices(
        SETUP,
        """
        ref_loss = loss_fn(reference, tokens, targets)
        ref_loss.backward()
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        ref_opt.step()

        torch.manual_seed(0)
        fresh = TinyTransformer()
        with torchlax_core.enable(), D.mesh_placement(mesh):   # constants land on the mesh too
            model = fresh.to("jax")
            q_weight = model.layers[0].attn.q_proj.weight
            opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built before sharding
            D.shard(model, mesh, D.megatron_rules("model"))
            assert model.layers[0].attn.q_proj.weight is q_weight  # same Parameter objects
            specs = {n: p.jax().sharding.spec for n, p in model.named_parameters()}
            assert specs["layers.0.attn.q_proj.weight"] == P("model", None)
            assert specs["layers.0.attn.q_proj.bias"] == P("model")
            assert specs["layers.0.attn.o_proj.weight"] == P(None, "model")
            assert specs["layers.1.mlp.up_proj.weight"] == P("model", None)
            assert specs["layers.1.mlp.down_proj.weight"] == P(None, "model")
            assert specs["embed_tokens.weight"] == P("model", None)
            assert specs["layers.0.ln1.weight"] == P()
            assert D.shard_shapes(q_weight) == [(8, 32)] * 8   # 32 rows over 4 model devices

            tk = D.shard(tokens.to("jax"), mesh, P("data"))
            tg = D.shard(targets.to("jax"), mesh, P("data"))
            loss = loss_fn(model, tk, tg)
            loss.backward()
            opt.step()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach())
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=2e-5, rtol=2e-5, msg=name)
            assert p.jax().sharding.spec == specs[name], name   # the step kept the layout
        print("ok")
    """,
    )


def test_jit_keeps_shardings_and_gives_the_ones_asked_for():
    run_on_devices(
        SETUP,
        """
        import torchlax_interop
        ref_loss = loss_fn(reference, tokens, targets)
        grads = torch.autograd.grad(ref_loss, list(reference.parameters()))

        with torchlax_core.enable():
            model = copy.deepcopy(reference).to("jax")
            D.shard(model, mesh, D.megatron_rules("model", data_axis="data"))
            tk = D.shard(tokens.to("jax"), mesh, P("data"))
            tg = D.shard(targets.to("jax"), mesh, P("data"))

            # torchlax_interop.jit: one program over the sharded weights; shard() inside a
            # jitted function is a sharding constraint, so the output has the layout asked for
            def logits_fn(tokens):
                return D.shard(model(tokens), mesh, P("data", None, "model"))
            logits = torchlax_interop.jit(logits_fn)(tk)
            assert logits.jax().sharding.spec == P("data", None, "model"), logits.jax().sharding
            torch.testing.assert_close(logits.cpu(), reference(tokens).detach(), atol=1e-5, rtol=1e-5)

            # sharded_jit: torchlax_interop.jit of the module with out_shardings as asked,
            # forward and backward (the weights stay program inputs)
            for spec in (P(None, None, "model"), P("data", None, None)):
                jitted_model = D.sharded_jit(model, mesh, spec)
                logits = jitted_model(tk)
                assert logits.jax().sharding.is_equivalent_to(NamedSharding(mesh, spec), 3), spec
                torch.testing.assert_close(logits.detach().cpu(), reference(tokens).detach(),
                                           atol=1e-5, rtol=1e-5)
            with D.mesh_placement(mesh):   # the eager loss makes constants: on the mesh
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tg.reshape(-1))
                loss.backward()
            for (name, p), g in zip(model.named_parameters(), grads):
                torch.testing.assert_close(p.grad.cpu(), g, atol=1e-5, rtol=1e-4, msg=name)
            model.zero_grad(set_to_none=True)

            # a functional training step under jax.jit with explicit in/out shardings
            params, _, apply = torchlax_interop.functional(model)
            param_shardings = {n: a.sharding for n, a in params.items()}
            batch = NamedSharding(mesh, P("data"))

            def step(params, tokens, targets):
                def loss_of(params):
                    logits = apply(params, tokens)
                    with torchlax_core.enable():
                        l = torch.nn.functional.cross_entropy(
                            torchlax_core.wrap(logits).reshape(-1, 64),
                            torchlax_core.wrap(targets).reshape(-1))
                    return l.jax()
                loss, g = jax.value_and_grad(loss_of)(params)
                return loss, jax.tree.map(lambda p, g: p - 0.5 * g, params, g)

            jitted = jax.jit(step, in_shardings=(param_shardings, batch, batch),
                             out_shardings=(NamedSharding(mesh, P()), param_shardings))
            compiled = jitted.lower(params, tk.jax(), tg.jax()).compile()
            in_shardings, _ = compiled.input_shardings
            for name, s in in_shardings[0].items():
                assert s.is_equivalent_to(param_shardings[name], params[name].ndim), name
            assert in_shardings[1].is_equivalent_to(batch, 2)
            out_loss, out_params = compiled.output_shardings
            for name, s in out_params.items():
                assert s.is_equivalent_to(param_shardings[name], params[name].ndim), name
            loss, new_params = compiled(params, tk.jax(), tg.jax())
        torch.testing.assert_close(torchlax_core.wrap(loss).cpu(), ref_loss.detach())
        for (name, q), g in zip(reference.named_parameters(), grads):
            new = torchlax_core.wrap(new_params[name])
            assert new.jax().sharding.is_equivalent_to(param_shardings[name], q.ndim), name
            torch.testing.assert_close(new.cpu(), (q - 0.5 * g).detach(), atol=2e-5, rtol=2e-5,
                                       msg=name)
        print("ok")
    """,
    )


def test_fsdp_training_step_equals_unsharded():
    run_on_devices(
        SETUP,
        """
        import torchlax_interop
        ref_loss = loss_fn(reference, tokens, targets)
        ref_loss.backward()
        # eps well above float noise: the key bias's true gradient is 0 (softmax is shift
        # invariant), and AdamW would otherwise amplify rounding noise of ~1e-9 to lr-sized steps
        torch.optim.AdamW(reference.parameters(), lr=1e-2, eps=1e-3).step()

        torch.manual_seed(0)
        with torchlax_core.enable():
            # every parameter lands sharded as it moves to the mesh (no full copy on device 0)
            model = TinyTransformer()
            with D.mesh_placement(mesh):
                model = model.to("jax")
            D.shard(model, mesh, D.fsdp_rules("data"))
            for name, p in model.named_parameters():
                spec = p.jax().sharding.spec
                largest = max(range(p.ndim), key=lambda i: (p.shape[i], -i))
                assert spec[largest] == "data" and all(a is None for i, a in enumerate(spec) if i != largest), (name, spec)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
            tk = D.shard(tokens.to("jax"), mesh, P("data"))
            tg = D.shard(targets.to("jax"), mesh, P("data"))
            # the model as one jitted program (its backward another); loss and AdamW eagerly
            compiled = torchlax_interop.jit(model)
            with D.mesh_placement(mesh):
                logits = compiled(tk)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tg.reshape(-1))
                loss.backward()
                opt.step()

        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach())
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4, msg=name)
        print("ok")
    """,
    )


def test_mesh_placement_puts_new_tensors_on_the_mesh_until_exit():
    run_on_devices("""
        mesh = D.make_mesh((8,), ("data",))
        env = torchlax_core.default_env()
        before = len(env.plugins())
        with torchlax_core.enable():
            with D.mesh_placement(mesh, P("data")):
                x = torch.randn(16, 3, device="jax")
                y = torch.ones(8).to("jax")
                assert x.jax().sharding == NamedSharding(mesh, P("data")), x.jax().sharding
                assert y.jax().sharding == NamedSharding(mesh, P("data"))
                assert D.shard_shapes(x) == [(2, 3)] * 8
                assert len(env.plugins()) == before + 1
            with D.mesh_placement(mesh):
                lin = torch.nn.Linear(4, 8).to("jax")
                assert lin.weight.jax().sharding == NamedSharding(mesh, P())
                assert len(lin.weight.jax().devices()) == 8
            z = torch.randn(2, device="jax")
            assert len(z.jax().devices()) == 1
            assert len(env.plugins()) == before

            # shard() of a module still on the CPU moves its weights straight onto the mesh
            cpu = torch.nn.Linear(4, 16)
            expected = cpu(torch.ones(2, 4)).detach()
            D.shard(cpu, mesh, D.fsdp_rules("data"))
            assert isinstance(cpu.weight, torch.nn.Parameter) and cpu.weight.requires_grad
            assert cpu.weight.jax().sharding == NamedSharding(mesh, P("data"))
            assert D.shard_shapes(cpu.bias) == [(2,)] * 8
            with D.mesh_placement(mesh):
                out = cpu(torch.ones(2, 4, device="jax"))
            torch.testing.assert_close(out.detach().cpu(), expected)
        print("ok")
    """)
