"""The example third-party plugin, loaded through its entry point in a fresh process.

The suite blocks it (tests/conftest.py); each test here runs a subprocess with the block lifted,
as a user who installed the plugin would run.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import fresh_python
import pytest


def run(code: str, *, block: str = "", extra_path: Path | None = None, **env_vars) -> str:
    env = {**os.environ, "TORCHLAX_BLOCK_PLUGINS": block, **env_vars}
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = fresh_python.run(["-c", textwrap.dedent(code)], env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-6000:]
    return out.stdout


def test_new_op_runs_eagerly_and_under_jax_jit():
    out = run("""
        import jax, jax.numpy as jnp, torch, torchlax_core
        import torchlax_example_plugin as example
        x = torch.linspace(-3, 3, 12).reshape(3, 4)
        expected = example.scaled_swish(x, 1.5)
        env = torchlax_core.default_env()
        print(env.lowering_for(torch.ops.example.scaled_swish.default).plugin)
        with torchlax_core.enable():
            t = x.to("jax")
            eager = example.scaled_swish(t, 1.5)
        assert isinstance(eager, torchlax_core.Tensor)
        torch.testing.assert_close(eager.cpu(), expected)

        def f(a):
            return torch.ops.example.scaled_swish(torchlax_core.wrap(a), 1.5).jax()

        jitted = jax.jit(f)(t.jax())
        torch.testing.assert_close(torch.from_numpy(jax.device_get(jitted).copy()), expected)
        # autograd through the plugin's op on torchlax tensors, vs CPU
        xc = x.clone().requires_grad_()
        example.scaled_swish(xc, 1.5).sum().backward()
        with torchlax_core.enable():
            xj = x.to("jax").requires_grad_()
        example.scaled_swish(xj, 1.5).sum().backward()
        torch.testing.assert_close(xj.grad.cpu(), xc.grad)
        print("ok")
    """)
    assert out.split() == ["example", "ok"]


def test_new_op_runs_under_torchlax_jit_torch_compile_and_export(tmp_path):
    out = run(f"""
        import numpy as np, torch, torchlax, torchlax_dynamo, torchlax_export
        import torchlax_example_plugin as example

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(6, 6)

            def forward(self, x):
                return example.scaled_swish(self.proj(x), 0.7)

        torch.manual_seed(0)
        model, x = Block(), torch.randn(3, 6)
        expected = model(x).detach()
        with torchlax.enable():
            jitted = torchlax.jit(model.to("jax"))(x.to("jax"))
        torch.testing.assert_close(jitted.cpu(), expected)
        model.to("cpu")
        compiled = torch.compile(model, backend="torchlax", fullgraph=True)
        torch.testing.assert_close(compiled(x), expected)
        assert torchlax_dynamo.counters["eager_nodes"] == 0, dict(torchlax_dynamo.counters)
        artifact = torchlax_export.export(model, (x,))
        artifact.save({str(tmp_path / "block")!r})
        served = torchlax_export.load({str(tmp_path / "block")!r})(x.numpy())
        torch.testing.assert_close(torch.from_numpy(np.asarray(served).copy()), expected)
        print("ok")
    """)
    assert out.split() == ["ok"]


def test_override_replaces_softmax_and_blocking_restores_builtin():
    code = """
        import torch, torchlax_core
        env = torchlax_core.default_env()
        print(env.lowering_for(torch.ops.aten._softmax.default).plugin)
        x = torch.randn(4, 5, dtype=torch.bfloat16)
        with torchlax_core.enable():
            got = torch.softmax(x.to("jax"), dim=-1)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.cpu(), torch.softmax(x, dim=-1), atol=1e-2, rtol=1e-2)
        # The override changes no result: exact in float32 and float64 too.
        for dtype in (torch.float32, torch.float64):
            y = torch.randn(6, 7, dtype=dtype) * 4
            with torchlax_core.enable():
                got = torch.softmax(y.to("jax"), dim=-1)
            assert got.dtype == dtype
            torch.testing.assert_close(got.cpu(), torch.softmax(y, dim=-1), atol=0,
                                       rtol=1e-15 if dtype == torch.float64 else 1e-6)
    """
    assert run(code).split() == ["example"]
    assert run(code, block="example").split() == ["ops"]


def test_placement_hook_places_new_tensors_on_a_device_and_a_mesh():
    out = run(
        """
        import jax, numpy as np, torch, torchlax_core
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import torchlax_example_plugin as example
        devices = jax.devices()
        assert len(devices) == 8
        example.place_on(devices[5])
        with torchlax_core.enable():
            t = torch.ones(8, 2, device="jax")
        print(t.device, t.jax().devices() == {devices[5]})
        mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
        sharding = NamedSharding(mesh, P("data", None))
        example.place_on(sharding)
        with torchlax_core.enable():
            s = torch.zeros(8, 2, device="jax")
        print(s.jax().sharding.is_equivalent_to(sharding, 2), len(s.jax().devices()))
        example.place_on(None)
        with torchlax_core.enable():
            print(torch.ones(1, device="jax").device)
    """,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    assert out.split() == ["jax:5", "True", "True", "8", "jax:0"]


def _fake_distribution(root: Path, dist: str, module: str, source: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 9.9\n")
    (info / "entry_points.txt").write_text(f"[torchlax]\n{module} = {module}\n")


@pytest.fixture
def broken_and_conflicting(tmp_path) -> Path:
    _fake_distribution(
        tmp_path,
        "torchlax-broken",
        "broken_plugin",
        "raise RuntimeError('this plugin is broken on purpose')\n",
    )
    _fake_distribution(
        tmp_path,
        "torchlax-late-adder",
        "late_adder",
        """
        import torch
        from torchlax_core import hookimpl

        @hookimpl
        def torchlax_register_lowerings(registry):
            registry.register_lowering(torch.ops.aten.add.Tensor, lambda a, b, alpha=1: a + b)
    """,
    )
    _fake_distribution(
        tmp_path,
        "torchlax-misnamed",
        "misnamed_arg",
        """
        from torchlax_core import hookimpl

        @hookimpl
        def torchlax_register_lowerings(reg):  # the hookspec's argument is `registry`
            raise AssertionError("never called")
    """,
    )
    return tmp_path


def test_bad_installed_plugins_are_reported_skipped_and_the_rest_load(broken_and_conflicting):
    # One raises on import, one claims aten.add.Tensor (owned by 'ops') without override=True,
    # one misnames its hook's argument: each is reported (warning, error log, record) and
    # skipped; every other plugin loads and programs run.
    code = """
        import warnings, torch, torchlax_core
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = torchlax_core.default_env()
        for name in ("broken_plugin", "late_adder", "misnamed_arg"):
            print([str(w.message).splitlines()[0] for w in caught if repr(name) in str(w.message)])
        print(sorted((r.name, r.status) for r in env.plugins() if r.status != "loaded"))
        print(env.lowering_for(torch.ops.aten.mul.Tensor).plugin,
              env.lowering_for(torch.ops.aten.add.Tensor).plugin)
        with torchlax_core.enable():
            print((torch.ones(2, device="jax") + 1).tolist())
    """
    env = {
        **os.environ,
        "TORCHLAX_BLOCK_PLUGINS": "example",
        "TORCHLAX_LOG": "error",
        "PYTHONPATH": str(broken_and_conflicting),
    }
    out = fresh_python.run(["-c", textwrap.dedent(code)], env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-6000:]
    lines = out.stdout.strip().splitlines()
    for name, line in zip(("broken_plugin", "late_adder", "misnamed_arg"), lines, strict=False):
        assert f"torchlax plugin '{name}' failed and was skipped" in line
    assert lines[3] == str(
        sorted(
            [
                ("broken_plugin", "failed"),
                ("example", "blocked"),
                ("late_adder", "failed"),
                ("misnamed_arg", "failed"),
            ]
        )
    )
    assert lines[4:] == ["ops ops", "[2.0, 2.0]"]
    # the error log (logger "torchlax") says the same
    assert (
        "torchlax plugin 'late_adder' failed and was skipped: PluginConflictError: Plugins "
        "'ops' and 'late_adder' both register a lowering for aten.add.Tensor" in out.stderr
    )
    assert (
        "torchlax plugin 'misnamed_arg' failed and was skipped: PluginValidationError" in out.stderr
    )

    strict = fresh_python.run(
        ["-c", "import torchlax_core; torchlax_core.default_env()"],
        timeout=300,
        env={**env, "TORCHLAX_STRICT_PLUGINS": "1", "TORCHLAX_LOG": ""},
    )
    assert strict.returncode != 0
    assert "PluginError: torchlax plugin 'broken_plugin' failed to load" in strict.stderr
    assert "this plugin is broken on purpose" in strict.stderr


def test_doctor_lists_versions_devices_plugins_and_counts(broken_and_conflicting):
    out = fresh_python.run(
        ["-m", "torchlax", "doctor"],
        timeout=300,
        env={
            **os.environ,
            "TORCHLAX_BLOCK_PLUGINS": "misnamed_arg",
            "PYTHONPATH": str(broken_and_conflicting),
        },
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in (
        "torch ",
        "jax ",
        "jaxlib ",
        "torchlax-core ",
        "torchlax-ops ",
        "JAX devices (cpu):",
        "0: cpu:0",
    ):
        assert needle in text
    plugins = text.split("Plugins (load order):")[1].split("Blocked plugins")[0]
    assert "torchlax.transfer" in plugins and "torchlax-core 0.1.0" in plugins
    ops_line = next(line for line in plugins.splitlines() if line.strip().startswith("ops "))
    assert "torchlax-ops 0.1.0" in ops_line and "lowerings" in ops_line
    example_line = next(
        line for line in plugins.splitlines() if line.strip().startswith("example ")
    )
    assert "torchlax-example-plugin 0.1.0" in example_line and "2 lowerings" in example_line
    assert "misnamed_arg (torchlax-misnamed)" in text.split("Blocked plugins")[1]
    failed = text.split("Failed plugins:")[1]
    assert (
        "broken_plugin (torchlax-broken): RuntimeError: this plugin is broken on purpose" in failed
    )
    assert (
        "late_adder (torchlax-late-adder): torchlax_core._errors.PluginConflictError: Plugins "
        "'ops' and 'late_adder' both register a lowering for aten.add.Tensor"
    ) in failed


def test_doctor_reports_in_strict_mode_instead_of_crashing(broken_and_conflicting):
    out = fresh_python.run(
        ["-m", "torchlax", "doctor"],
        timeout=300,
        env={
            **os.environ,
            "TORCHLAX_BLOCK_PLUGINS": "example,broken_plugin,misnamed_arg",
            "TORCHLAX_STRICT_PLUGINS": "1",
            "PYTHONPATH": str(broken_and_conflicting),
        },
    )
    assert out.returncode == 0, out.stderr
    assert (
        "late_adder (torchlax-late-adder): torchlax_core._errors.PluginConflictError" in out.stdout
    )
    assert (
        "torchlax.default_env() raises (TORCHLAX_STRICT_PLUGINS=1):\n  PluginError: torchlax "
        "plugin 'late_adder' failed to load:" in out.stdout
    )
