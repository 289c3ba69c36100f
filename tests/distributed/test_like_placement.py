"""``zeros_like(x)`` and its kin keep a committed ``x``'s sharding (PyTorch keeps the device),
and ``zero_``/``fill_`` leave a tensor where it is."""

import pytest
from _multidevice import run_on_devices

pytestmark = pytest.mark.slow  # a fresh Python process with 8 simulated devices


def test_like_ops_keep_the_sharding_and_the_values():
    run_on_devices(
        """
        mesh = D.make_mesh((2, 4), ("data", "model"))
        spec = NamedSharding(mesh, P("data", "model"))
        host = torch.randn(8, 16)
        with torchlax_core.enable():
            x = D.shard(host.to("jax"), mesh, P("data", "model"))
            on3 = host.to("jax:3")
            cases = {
                "zeros_like": (torch.zeros_like, None),
                "ones_like": (torch.ones_like, None),
                "empty_like": (lambda t: torch.empty_like(t).zero_(), None),
                "full_like": (lambda t: torch.full_like(t, 2.5), None),
                "zeros_like int32": (lambda t: torch.zeros_like(t, dtype=torch.int32), None),
                "new_ones": (lambda t: t.new_ones(t.shape), None),
                "new_full": (lambda t: t.new_full((8, 16), 7.0), None),
                "rand_like": (torch.rand_like, 0),
                "randn_like": (torch.randn_like, 0),
                "randint_like": (lambda t: torch.randint_like(t, 3, 9), 0),
            }
            for name, (op, seed) in cases.items():
                for src, want_sharding in ((x, spec), (on3, on3.jax().sharding)):
                    if seed is not None:
                        torch.manual_seed(seed)
                    got = op(src)
                    assert got.jax().committed, name
                    assert got.jax().sharding == want_sharding, (name, got.jax().sharding)
                    if seed is not None:
                        torch.manual_seed(seed)
                    plain = op(host.to("jax"))  # uncommitted: the usual path, the same numbers
                    assert not plain.jax().committed, name
                    torch.testing.assert_close(got.cpu(), plain.cpu(), msg=name)
                    assert got.dtype == plain.dtype and got.stride() == plain.stride(), name
            torch.testing.assert_close(torch.full_like(x, 2.5).cpu(), torch.full_like(host, 2.5))
            # new_* of another shape: replicated over the same devices.
            other = x.new_zeros((3, 5))
            assert other.jax().sharding == NamedSharding(mesh, P()), other.jax().sharding
            assert on3.new_zeros((3,)).jax().sharding == on3.jax().sharding
            # A transposed input's layout is kept as PyTorch keeps it.
            t = torch.zeros_like(x.t())
            assert t.stride() == torch.zeros_like(host.t()).stride()
            # In-place fills never move a tensor (twice: the op cache's hit path too).
            for _ in range(2):
                z, f = x.clone(), x.clone()
                z.zero_()
                f.fill_(2.0)
                assert z.jax().sharding == spec and f.jax().sharding == spec
            torch.testing.assert_close(f.cpu(), torch.full_like(host, 2.0))
            # An optimizer's state is laid out like its parameters from the start.
            w = torch.nn.Parameter(D.shard(torch.randn(8, 16).to("jax"), mesh, P(None, "model")))
            opt = torch.optim.Adam([w], lr=0.1)
            w.grad = torch.ones_like(w)
            opt.step()
            assert opt.state[w]["exp_avg"].jax().sharding == w.jax().sharding
        print("ok")
        """
    )
