"""torch.distributed functional collectives inside shard_map equal their definitions."""

import pytest
from _multidevice import run_on_devices

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow


def test_collectives_match_definitions():
    run_on_devices("""
        import warnings
        import torch.distributed._functional_collectives as fc
        warnings.simplefilter("ignore", FutureWarning)

        mesh = D.make_mesh((2, 4), ("data", "model"))
        x = torch.randn(2 * 4 * 4, 6)            # rows split over data x model: blocks of 4
        blocks = x.reshape(2, 4, 4, 6)            # [data, model, rows, cols]
        ints = torch.randint(-50, 50, (32, 6))
        spec = P(("data", "model"))

        def per_device(result):                  # (32, ...) -> [data, model, ...]
            return result.reshape(2, 4, -1, *result.shape[1:])

        def along_model(per_group):              # one value per data group -> every device
            return per_group.unsqueeze(1).expand(2, 4, *per_group.shape[1:])

        with torchlax_core.enable():
            xj, ij = x.to("jax"), ints.to("jax")

            # all_reduce: every reduce op, over the axis named as the group
            for op, ref in [("sum", blocks.sum(1)), ("avg", blocks.mean(1)),
                            ("max", blocks.amax(1)), ("min", blocks.amin(1)),
                            ("product", blocks.prod(1))]:
                f = D.shard_map(lambda t, op=op: fc.all_reduce(t, op, "model"), mesh, spec, spec)
                out = f(xj)
                torch.testing.assert_close(per_device(out.cpu()), along_model(ref), msg=op)
                assert out.shape == x.shape
            f = D.shard_map(lambda t: fc.all_reduce(t, "sum", "model"), mesh, spec, spec)
            out = f(ij)
            assert out.dtype == torch.int64
            assert torch.equal(per_device(out.cpu()), along_model(ints.reshape(2, 4, 4, 6).sum(1)))

            # all_reduce over the data axis, set with collectives_axis (the group is ignored)
            with D.collectives_axis("data") as group:
                f = D.shard_map(lambda t: fc.all_reduce(t, "sum", "ignored"), mesh, spec, spec)
                out = f(xj)
            torch.testing.assert_close(per_device(out.cpu()),
                                       blocks.sum(0, keepdim=True).expand(2, 4, 4, 6))
            assert group == "data"

            # all_gather: each device gets its model group's blocks concatenated (dims 0 and 1)
            f = D.shard_map(lambda t: fc.all_gather_tensor(t, 0, "model"), mesh, spec, spec)
            out = per_device(f(xj).cpu())
            assert out.shape == (2, 4, 16, 6)  # 4 rows per device, gathered over 4 devices
            torch.testing.assert_close(out, along_model(blocks.reshape(2, 16, 6)))
            f = D.shard_map(lambda t: fc.all_gather_tensor(t, 1, "model"), mesh, spec, spec)
            out = per_device(f(xj).cpu())
            assert out.shape == (2, 4, 4, 24)
            torch.testing.assert_close(out, along_model(blocks.permute(0, 2, 1, 3).reshape(2, 4, 24)))

            # reduce_scatter: sum over the group, device i keeps rows [i] of the sum
            for op, reduce in [("sum", lambda b: b.sum(1)), ("avg", lambda b: b.mean(1)),
                               ("max", lambda b: b.amax(1))]:
                f = D.shard_map(lambda t, op=op: fc.reduce_scatter_tensor(t, op, 0, "model"),
                                mesh, spec, spec)
                out = per_device(f(xj).cpu())
                assert out.shape == (2, 4, 1, 6)
                torch.testing.assert_close(out.reshape(2, 4, 6), reduce(blocks), msg=op)

            # broadcast from group rank 2
            f = D.shard_map(lambda t: fc.broadcast(t, 2, "model"), mesh, spec, spec)
            torch.testing.assert_close(per_device(f(xj).cpu()), along_model(blocks[:, 2]))

            # all_to_all_single: device j's chunk i goes to device i, as chunk j
            f = D.shard_map(lambda t: fc.all_to_all_single(t, None, None, "model"), mesh, spec, spec)
            out = per_device(f(xj).cpu())
            expected = blocks.reshape(2, 4, 4, 1, 6).transpose(1, 2).reshape(2, 4, 4, 6)
            torch.testing.assert_close(out, expected)

            # the in-place and coalesced overloads
            c10d = torch.ops._c10d_functional
            def inplace(t):
                t = t.clone()
                c10d.all_reduce_(t, "sum", "model")
                return t
            out = D.shard_map(inplace, mesh, spec, spec)(xj)
            torch.testing.assert_close(per_device(out.cpu()), along_model(blocks.sum(1)))
            f = D.shard_map(lambda a, b: tuple(c10d.all_reduce_coalesced([a, b], "max", "model")),
                            mesh, (spec, spec), (spec, spec))
            a, b = f(xj, ij)
            torch.testing.assert_close(per_device(a.cpu()), along_model(blocks.amax(1)))
            assert torch.equal(per_device(b.cpu()), along_model(ints.reshape(2, 4, 4, 6).amax(1)))

            # a Megatron MLP by hand: column-parallel up, row-parallel down, one all_reduce
            torch.manual_seed(1)
            up, down = torch.nn.Linear(6, 16, bias=False), torch.nn.Linear(16, 6, bias=False)
            rows = torch.randn(8, 6)
            expected = down(torch.nn.functional.gelu(up(rows))).detach()
            def mlp(x, w_up, w_down):   # w_up: (16/4, 6) rows, w_down: (6, 16/4) columns
                partial = torch.nn.functional.gelu(x @ w_up.T) @ w_down.T
                return fc.all_reduce(partial, "sum", "model")
            f = D.shard_map(mlp, mesh, (P("data"), P("model", None), P(None, "model")), P("data"))
            out = f(rows.to("jax"), up.weight.detach().to("jax"), down.weight.detach().to("jax"))
            torch.testing.assert_close(out.cpu(), expected, atol=1e-6, rtol=1e-5)

            # the same under jax.jit, on a sharded input: one XLA program
            f = D.shard_map(lambda t: fc.all_reduce(t * 2, "sum", "model"), mesh, spec, spec)
            jitted = jax.jit(lambda a: f(torchlax_core.wrap(a)).jax())
            sharded = jax.device_put(xj.jax(), NamedSharding(mesh, spec))
            out = torchlax_core.wrap(jitted(sharded))
            torch.testing.assert_close(per_device(out.cpu()), along_model(2 * blocks.sum(1)))
            assert out.jax().sharding.spec == spec
        print("ok")
    """)


def test_collectives_in_call_torch_under_jax_shard_map_and_errors():
    run_on_devices("""
        import warnings
        import jax.numpy as jnp
        import torch.distributed._functional_collectives as fc
        import torchlax_interop
        warnings.simplefilter("ignore", FutureWarning)
        mesh = D.make_mesh((2, 4), ("data", "model"))

        # plain jax.shard_map around call_torch; process_groups_for lets torch look up sizes
        def body(t):
            return fc.all_gather_tensor(fc.all_reduce(t, "sum", "model") * 2, 0, "data")
        f = jax.shard_map(lambda a: torchlax_interop.call_torch(body, a), mesh=mesh,
                          in_specs=P(("data", "model")), out_specs=P(("data", "model")),
                          check_vma=False)
        x = jnp.arange(32.0 * 3).reshape(32, 3)
        with D.process_groups_for(mesh):
            out = np.asarray(jax.jit(f)(x))
        blocks = np.asarray(x).reshape(2, 4, 4, 3)
        reduced = 2 * blocks.sum(1)                               # [data, rows, cols]
        per_device = np.concatenate([reduced[0], reduced[1]])     # gathered over data
        np.testing.assert_allclose(out.reshape(8, 8, 3), np.broadcast_to(per_device, (8, 8, 3)))

        with torchlax_core.enable():
            x = torch.randn(8, 2).to("jax")
            f = D.shard_map(lambda t: fc.all_reduce(t, "sum", "nope"), mesh, P("data"), P("data"))
            try:
                f(x)
            except Exception as e:
                assert "no mesh axis bound here" in str(e), e
            else:
                raise AssertionError("an unknown axis must raise")
            f = D.shard_map(lambda t: fc.all_reduce(t, "bxor", "data"), mesh, P("data"), P("data"))
            try:
                f(x)
            except Exception as e:
                assert "'bxor' is not supported" in str(e), e
            else:
                raise AssertionError("an unsupported reduce op must raise")
        print("ok")
    """)
