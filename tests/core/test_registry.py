"""The pluggy registry: loading, ownership, conflicts, overrides, blocking, failures."""

from __future__ import annotations

import textwrap
import types

import fresh_python
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_core import Environment, OpNotLoweredError, PluginConflictError, PluginError, hookimpl

aten = torch.ops.aten


@pytest.fixture
def env():
    """A fresh environment with entry-point autoload off: only core's built-ins."""
    return Environment(autoload=False)


@pytest.fixture
def plugins(env):
    """Register plugins into ``env``; every one is unregistered afterwards."""
    registered = []

    def register(plugin, name=None):
        result = env.register_plugin(plugin, name)
        if result is not None:
            registered.append(result)
        return result

    yield register
    for name in reversed(registered):
        if env.plugin_manager.get_plugin(name) is not None:
            env.unregister_plugin(name)


def lowering_plugin(op, fn, *, override=False):
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):
        registry.register_lowering(op, fn, override=override)

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    return plugin


def run_add(env, a, b):
    with torchlax_core.enable(env):
        return torchlax_core.wrap(jnp.asarray(a)) + torchlax_core.wrap(jnp.asarray(b))


def test_builtin_plugins_are_named_and_listed(env):
    names = {record.name: record.status for record in env.plugins()}
    assert names == {
        "torchlax.device": "loaded",
        "torchlax.transfer": "loaded",
        "torchlax.fallback": "loaded",
    }


def test_autoload_off_leaves_ops_unlowered(env):
    assert env.lowering_for(aten.add.Tensor) is None
    with pytest.raises(OpNotLoweredError) as info:
        run_add(env, [1.0], [2.0])
    message = str(info.value)
    assert "aten.add.Tensor" in message
    assert "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor" in message
    assert "plugins asked: torchlax.device, torchlax.transfer, torchlax.fallback" in message
    assert "registry.register_lowering(torch.ops.aten.add.Tensor, my_jax_function)" in message
    assert isinstance(info.value, NotImplementedError)
    assert info.value.op is aten.add.Tensor


def test_registration_after_creation_takes_effect(env, plugins):
    with pytest.raises(OpNotLoweredError):
        run_add(env, [1.0], [2.0])
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "adder")
    out = run_add(env, [1.0], [2.0])
    assert out.tolist() == [3.0]
    owner = env.lowering_for(aten.add.Tensor)
    assert (owner.plugin, owner.kind) == ("adder", "lowering")


def test_packet_registration_covers_every_overload(env, plugins):
    plugins(lowering_plugin(aten.add, lambda a, b, alpha=1: a + b), "adder")
    assert env.lowering_for(aten.add.Tensor).plugin == "adder"
    assert env.lowering_for(aten.add.Scalar).plugin == "adder"


def test_inplace_variant_is_derived_from_functional(env, plugins):
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "adder")
    with torchlax_core.enable(env):
        x = torchlax_core.wrap(jnp.asarray([1.0, 2.0]))
        before, ident = x._version, id(x)
        x.add_(x)
        assert id(x) == ident and x._version == before + 1
        assert x.tolist() == [2.0, 4.0]
    assert env.lowering_for(aten.add_.Tensor).plugin == "adder"


def test_conflict_names_both_plugins(env, plugins):
    plugins(lowering_plugin(aten.mul.Tensor, lambda a, b: a * b), "first")
    with pytest.raises(PluginConflictError) as info:
        plugins(lowering_plugin(aten.mul.Tensor, lambda a, b: a * b), "second")
    assert "'first'" in str(info.value) and "'second'" in str(info.value)
    assert "override=True" in str(info.value)
    assert isinstance(info.value, PluginError) and info.value.plugins == ("first", "second")


def test_conflict_leaves_the_environment_as_before(env, plugins):
    plugins(lowering_plugin(aten.mul.Tensor, lambda a, b: a * b), "first")
    before = _state(env)
    with pytest.raises(PluginConflictError):
        plugins(lowering_plugin(aten.mul.Tensor, lambda a, b: a * b + 1), "second")
    assert _state(env) == before
    assert env.plugin_manager.get_plugin("second") is None
    # later registrations still work (the conflicting plugin did not stay behind)
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "adder")
    assert run_add(env, [1.0], [2.0]).tolist() == [3.0]
    with torchlax_core.enable(env):
        x = torchlax_core.wrap(jnp.asarray([3.0]))
        assert (x * x).tolist() == [9.0]  # first's lowering, not second's


def test_override_replaces_and_unregister_restores(env, plugins):
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "base")
    plugins(
        lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b + 100, override=True), "better"
    )
    assert run_add(env, [1.0], [2.0]).tolist() == [103.0]
    assert env.lowering_for(aten.add.Tensor).plugin == "better"
    env.unregister_plugin("better")
    assert run_add(env, [1.0], [2.0]).tolist() == [3.0]
    assert env.lowering_for(aten.add.Tensor).plugin == "base"


def test_two_overrides_last_loaded_wins(env, plugins):
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "base")
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a * 0 + 1, override=True), "one")
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a * 0 + 2, override=True), "two")
    assert run_add(env, [5.0], [5.0]).tolist() == [2.0]
    assert env.lowering_for(aten.add.Tensor).plugin == "two"


def _state(env):
    """What a failed registration must leave unchanged."""
    return (
        [(r.name, r.status) for r in env.plugins()],
        env.plugin_manager.list_name_plugin(),
        {kind: dict(env._tables.table(kind)) for kind in ("lowering", "decomposition", "function")},
    )


def test_misspelled_hook_raises_and_leaves_nothing(env, plugins):
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowering(registry):  # missing the final "s"
        raise AssertionError("never called")

    plugin.torchlax_register_lowering = torchlax_register_lowering
    before = _state(env)
    with pytest.raises(PluginError, match="'typo'.*unknown hook 'torchlax_register_lowering'"):
        plugins(plugin, "typo")
    assert _state(env) == before


def test_misnamed_hook_argument_is_a_plugin_error_and_leaves_nothing(env, plugins):
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "adder")
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(reg):  # the hookspec's argument is `registry`
        raise AssertionError("never called")

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    before = _state(env)
    with pytest.raises(PluginError, match="'misnamed'") as info:
        plugins(plugin, "misnamed")
    assert "reg" in str(info.value) and "hookspec" in str(info.value)
    assert _state(env) == before
    # nothing stuck: the same name registers once the plugin is fixed
    plugins(lowering_plugin(aten.mul.Tensor, lambda a, b: a * b), "misnamed")
    assert env.lowering_for(aten.mul.Tensor).plugin == "misnamed"


def test_misspelled_hook_raises_in_strict_mode():
    env = Environment(autoload=False, strict_plugins=True)
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowering(registry):
        pass

    plugin.torchlax_register_lowering = torchlax_register_lowering
    with pytest.raises(PluginError, match="typo"):
        env.register_plugin(plugin, "typo")


def test_plugin_raising_while_registering_raises_and_leaves_nothing(env, plugins):
    plugins(lowering_plugin(aten.add.Tensor, lambda a, b, alpha=1: a + b), "good")
    broken = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):
        registry.register_lowering(aten.mul.Tensor, lambda a, b: a * b)
        raise ValueError("boom in broken plugin")

    broken.torchlax_register_lowerings = torchlax_register_lowerings
    before = _state(env)
    with pytest.raises(PluginError, match="'broken'.*boom in broken plugin"):
        env.register_plugin(broken, "broken")
    assert _state(env) == before
    assert env.lowering_for(aten.mul.Tensor) is None  # nothing half-registered
    assert env.lowering_for(aten.add.Tensor).plugin == "good"


def test_register_lowering_rejects_non_ops(env):
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):
        registry.register_lowering(torch.add, lambda a, b: a + b)

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    with pytest.raises(PluginError, match="'wrong'.*register_function"):
        env.register_plugin(plugin, "wrong")
    assert env.plugin_manager.get_plugin("wrong") is None


def test_device_placement_hook_first_result(env, plugins):
    import jax

    class Placement:
        @hookimpl
        def torchlax_device_placement(self, device, env):
            if device is not None and device.type == "jax" and device.index == 7:
                return jax.devices()[0]
            return None

    assert env.placement("jax") == jax.devices()[0]
    with pytest.raises(ValueError, match="jax:7 does not exist"):
        env.placement("jax:7")
    plugins(Placement(), "seven")
    assert env.placement("jax:7") == jax.devices()[0]


def test_configure_hook_is_historic(env, plugins):
    class Configure:
        @hookimpl
        def torchlax_configure(self, config):
            config.fallback_to_torch = True

    assert env.config.fallback_to_torch is False
    plugins(Configure(), "configure")
    assert env.config.fallback_to_torch is True


def test_fallback_hook_provides_implementation(env, plugins):
    calls = []

    class Fallback:
        @hookimpl
        def torchlax_fallback(self, op, env):
            calls.append(op)
            return lambda a, b, alpha=1: torchlax_core.wrap(a.jax() - b.jax())

    plugins(Fallback(), "minus")
    assert run_add(env, [5.0], [2.0]).tolist() == [3.0]
    run_add(env, [5.0], [2.0])
    assert calls == [aten.add.Tensor]  # asked once, then cached


def test_fallback_answering_a_non_callable_names_the_plugin(env, plugins):
    class Broken:
        @hookimpl
        def torchlax_fallback(self, op, env):
            return 1

    plugins(Broken(), "broken-fallback")
    with pytest.raises(PluginError, match="'broken-fallback' answered 1 for aten.add.Tensor"):
        run_add(env, [5.0], [2.0])


# -- a plugin's lowerings are checked against PyTorch's meta kernels ------------------------------


def _mm_inputs():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    return a, b


@pytest.mark.parametrize(
    "name, lowering, says",
    [
        ("half", lambda a, b: (a @ b).astype(jnp.float16), "returned float16[2, 4]"),
        ("transposed", lambda a, b: (a @ b).T, "returned float32[4, 2]"),
        ("none", lambda a, b: None, "returned None"),
        ("numpy", lambda a, b: np.asarray(a @ b), "returned a NumPy array float32[2, 4]"),
    ],
)
def test_wrong_lowering_output_raises_naming_op_and_plugin(env, plugins, name, lowering, says):
    plugins(lowering_plugin(aten.mm.default, lowering), name)
    a, b = _mm_inputs()
    with torchlax_core.enable(env):
        x, y = torchlax_core.wrap(jnp.asarray(a)), torchlax_core.wrap(jnp.asarray(b))
        with pytest.raises(PluginError) as info:
            torch.mm(x, y)
    message = str(info.value)
    assert f"Plugin {name!r}" in message and "aten.mm.default" in message
    assert says in message and "float32[2, 4]" in message
    assert f"TORCHLAX_BLOCK_PLUGINS={name}" in message


def test_wrong_lowering_output_raises_under_jax_jit(env, plugins):
    plugins(lowering_plugin(aten.mm.default, lambda a, b: (a @ b).T), "transposed")
    a, b = _mm_inputs()

    def f(p, q):
        with torchlax_core.enable(env):
            return torch.mm(torchlax_core.wrap(p), torchlax_core.wrap(q)).jax()

    with pytest.raises(PluginError, match="'transposed'.*aten.mm.default"):
        jax.jit(f)(a, b)


def test_correct_lowering_passes_and_is_checked_once_per_signature(env, plugins, monkeypatch):
    from torchlax_core import _plugin_checks

    checks = []
    real_check = _plugin_checks._check
    monkeypatch.setattr(
        _plugin_checks,
        "_check",
        lambda func, entry, args, *rest: (
            checks.append(args[0].shape),
            real_check(func, entry, args, *rest),
        ),
    )
    plugins(lowering_plugin(aten.mm.default, lambda a, b: a @ b), "good-mm")
    a, b = _mm_inputs()
    entry = env.lowering_for(aten.mm.default)
    assert env._checked(aten.mm.default, entry) is not entry.fn  # a third party's: checked
    with torchlax_core.enable(env):
        x, y = torchlax_core.wrap(jnp.asarray(a)), torchlax_core.wrap(jnp.asarray(b))
        for _ in range(3):
            np.testing.assert_allclose(np.asarray(torch.mm(x, y).jax()), a @ b)
        z = torchlax_core.wrap(jnp.ones((5, 3), jnp.float32))
        assert tuple(torch.mm(z, y).shape) == (5, 4)
    assert checks == [(2, 3), (5, 3)]  # once per input signature


def test_first_party_lowerings_are_not_wrapped():
    env = torchlax_core.default_env()
    entry = env.lowering_for(aten.add.Tensor)
    assert entry.plugin == "ops"
    assert env._checked(aten.add.Tensor, entry) is entry.fn  # the hot path pays nothing


def test_wrong_decomposition_output_raises(env, plugins):
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):  # the one hook registers decompositions too
        registry.register_decomposition(
            aten.mm.default, lambda a, b: torchlax_core.wrap(jnp.ones((3, 3), jnp.float32))
        )

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    plugins(plugin, "bad-decomposition")
    a, b = _mm_inputs()
    with torchlax_core.enable(env):
        x, y = torchlax_core.wrap(jnp.asarray(a)), torchlax_core.wrap(jnp.asarray(b))
        with pytest.raises(PluginError, match="'bad-decomposition'.*float32\\[3, 3\\]"):
            torch.mm(x, y)


def test_deprecated_decompositions_hook_warns_and_still_registers(env, plugins):
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_decompositions(registry):
        registry.register_decomposition(
            aten.mm.default,
            lambda a, b: torchlax_core.wrap(torchlax_core.unwrap(a) @ torchlax_core.unwrap(b)),
        )

    plugin.torchlax_register_decompositions = torchlax_register_decompositions
    with pytest.warns(
        DeprecationWarning,
        match="torchlax_register_decompositions is deprecated"
        ".*register_decomposition.*torchlax_register_lowerings",
    ):
        plugins(plugin, "old-style")
    assert env.lowering_for(aten.mm.default).plugin == "old-style"
    a, b = _mm_inputs()
    with torchlax_core.enable(env):
        out = torch.mm(torchlax_core.wrap(jnp.asarray(a)), torchlax_core.wrap(jnp.asarray(b)))
    np.testing.assert_allclose(np.asarray(torchlax_core.unwrap(out)), a @ b)


def _run(code: str, **env_vars) -> str:
    import os

    env = {**os.environ, **env_vars}
    out = fresh_python.run(["-c", textwrap.dedent(code)], env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ops_plugin_autoloads_through_entry_point():
    out = _run("""
        import torch, torchlax_core
        env = torchlax_core.default_env()
        owner = env.lowering_for(torch.ops.aten.add.Tensor)
        print(owner.plugin, [r.distribution for r in env.plugins() if r.name == owner.plugin][0])
    """)
    assert out.split() == ["ops", "torchlax-ops"]


def test_env_variables_block_and_disable_autoload():
    code = """
        import torch, torchlax_core
        env = torchlax_core.default_env()
        print(sorted((r.name, r.status) for r in env.plugins()))
        print(env.lowering_for(torch.ops.aten.add.Tensor))
    """
    blocked = _run(code, TORCHLAX_BLOCK_PLUGINS="ops,torchlax.fallback")
    assert "('ops', 'blocked')" in blocked and "('torchlax.fallback', 'blocked')" in blocked
    assert blocked.strip().endswith("None")
    off = _run(code, TORCHLAX_DISABLE_PLUGIN_AUTOLOAD="1")
    assert "'ops'" not in off and off.strip().endswith("None")


def test_an_override_keeps_pytorchs_dtype_contract():
    # torchlax-ops' softmax raises for integers as PyTorch's CPU kernel does; a plugin that
    # overrides it (as the example plugin does) replaces the computation, not that contract.
    env = Environment()
    calls = []

    def softmax(x, dim, half_to_float):
        calls.append(x.dtype)
        return jax.nn.softmax(x, axis=dim)

    env.register_plugin(lowering_plugin(aten._softmax.default, softmax, override=True), "mine")
    try:
        with torchlax_core.enable(env):
            floats = torch.softmax(torchlax_core.wrap(jnp.asarray([1.0, 2.0], jnp.float32)), 0)
            with pytest.raises(NotImplementedError) as info:
                torch.softmax(torchlax_core.wrap(jnp.asarray([1, 2], jnp.int64)), 0)
        with pytest.raises(NotImplementedError) as expected:
            torch.softmax(torch.tensor([1, 2]), 0)
        assert str(info.value) == str(expected.value)
        assert calls == [jnp.dtype(jnp.float32)]  # the integer call never reached the override
        torch.testing.assert_close(floats.cpu(), torch.softmax(torch.tensor([1.0, 2.0]), 0))
        assert env.lowering_for(aten._softmax.default).plugin == "mine"
    finally:
        env.unregister_plugin("mine")


@torch.library.custom_op("torchlax_test_errs::no_fake", mutates_args=())
def _no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2  # no fake kernel: the plugin check has no shapes to compare with


@pytest.mark.parametrize(
    "lowering, says",
    [
        (lambda x: np.asarray(x) * 2, "returned a NumPy array float32[3] (lowerings must return"),
        (lambda x: "done", "returned a str"),
    ],
    ids=["numpy", "string"],
)
def test_lowering_of_an_op_without_meta_kernel_returning_no_array(env, plugins, lowering, says):
    # issue 37: the NumPy array reached the user as the tensor's data
    plugins(lowering_plugin(torch.ops.torchlax_test_errs.no_fake.default, lowering), "np_out")
    with torchlax_core.enable(env):
        x = torchlax_core.wrap(jnp.ones(3, jnp.float32))
        with pytest.raises(PluginError, match="Plugin 'np_out'") as info:
            torch.ops.torchlax_test_errs.no_fake(x)
    assert says in str(info.value)
