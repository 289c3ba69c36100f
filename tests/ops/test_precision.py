"""Products and convolutions follow ``torch.set_float32_matmul_precision``; half operands stay half.

Read from the StableHLO torchlax emits (forward and PyTorch's autograd backward, traced as
``torchlax.jit`` traces a step): a float32 ``dot_general`` or ``convolution`` carries the
precision the mode names ("highest" -> HIGHEST, "high" -> HIGH, "medium" -> DEFAULT); one of
bfloat16/float16 operands takes them as they are (no float32 copy first) and accumulates in
float32. The caches that hold compiled code (the eager op cache, ``torchlax.jit``, the
``torch.compile`` backend) compile again when the mode changes. (On the CPU the precision does
not change values, so the tests read the programs and count compilations.)
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from _compare_cpu import stablehlo_with_grads


@pytest.fixture(autouse=True)
def restore_mode():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _conv(x, w, b):
    return F.conv2d(x, w, b, padding=1)


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


CASES = {
    "mm": (torch.mm, [(3, 8), (8, 5)]),
    "matmul": (torch.matmul, [(2, 3, 8), (8, 5)]),
    "bmm": (torch.bmm, [(2, 3, 8), (2, 8, 5)]),
    "linear": (F.linear, [(3, 8), (5, 8), (5,)]),
    "linear_nd": (F.linear, [(2, 3, 8), (5, 8), (5,)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5), [(3, 5), (3, 8), (8, 5)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), [(2, 3, 5), (2, 3, 8), (2, 8, 5)]),
    "conv2d": (_conv, [(2, 3, 6, 6), (4, 3, 3, 3), (4,)]),
    "attention": (_sdpa, [(2, 4, 8, 16)] * 3),
    "attention_gqa": (_gqa, [(2, 4, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)]),
}

_DOT = re.compile(r"stablehlo\.(dot_general|convolution)\b.*")
_TYPES = re.compile(r"tensor<[^>]*?x?(\w+)>")


def _products(text):
    """(line, operand element types, result element type) of each product or convolution."""
    found = []
    for match in _DOT.finditer(text):
        line = match.group(0)
        signature = line.rsplit(" : ", 1)[1]
        operands, result = signature.split("->")
        types = [t.rsplit("x", 1)[-1] for t in re.findall(r"tensor<([^>]*)>", operands)]
        (result_type,) = [t.rsplit("x", 1)[-1] for t in re.findall(r"tensor<([^>]*)>", result)]
        found.append((line, types, result_type))
    return found


@pytest.mark.parametrize(
    ("mode", "name"), [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_products_follow_the_mode(case, mode, name):
    fn, shapes = CASES[case]
    torch.set_float32_matmul_precision(mode)
    text = stablehlo_with_grads(fn, [jnp.ones(s, jnp.float32) for s in shapes])
    products = _products(text)
    assert len(products) >= 2  # the forward's and the backward's
    for line, types, _ in products:
        assert set(types) == {"f32"}, line
        precisions = re.findall(r"precision = \[(\w+), (\w+)\]", line) or re.findall(
            r"#stablehlo<precision (\w+)>, #stablehlo<precision (\w+)>", line
        )
        assert precisions == [(name, name)], line


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_half_operands_stay_half_and_accumulate_in_float32(case, dtype):
    fn, shapes = CASES[case]
    arrays = [jnp.ones(s, dtype) for s in shapes]
    half = "bf16" if dtype == jnp.bfloat16 else "f16"
    text = stablehlo_with_grads(fn, arrays)
    products = _products(text)
    assert len(products) >= 2
    for line, types, result in products:
        assert set(types) == {half}, f"a product of float32 copies of {half} operands: {line}"
        # A convolution's gradients round in XLA (which accumulates a half convolution in
        # float32) rather than returning a float32 result to round afterwards.
        assert result == "f32" or (result == half and "convolution" in line), line
    assert products[0][2] == "f32"  # the forward's first product
    # The results keep PyTorch's dtype.
    with torchlax_core.enable():
        tensors = [torchlax.torch_view(a) for a in arrays]
        assert fn(*tensors).dtype == torchlax_core.torch_dtype(dtype)


def test_values_match_pytorch_in_each_mode():
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    for mode in ("highest", "high", "medium"):
        torch.set_float32_matmul_precision(mode)
        with torchlax_core.enable():
            out = (a.to("jax") @ b.to("jax")).cpu()
        # (XLA:CPU computes float32 in full whatever the mode, as PyTorch's CPU does.)
        torch.testing.assert_close(out, a @ b)


# -- changing the mode compiles again ------------------------------------------------------------


@pytest.fixture
def env():
    env = torchlax_core.Environment()
    env.config.op_cache_size, env.config.op_cache_min_calls = 4096, 2
    with torchlax_core.enable(env):
        yield env


def _mm_modes(env):
    """The matmul precisions of the op cache's ``mm`` entries."""
    return sorted(
        key[-1][1]
        for key in env._op_cache.entries
        if key[0].func is torch.ops.aten.mm.default and isinstance(key[-1], tuple)
    )


def test_eager_op_cache_compiles_again_for_a_new_mode(env):
    a_cpu, b_cpu = torch.randn(4, 6), torch.randn(6, 3)
    a, b = a_cpu.to("jax"), b_cpu.to("jax")
    torch.set_float32_matmul_precision("highest")
    for _ in range(3):
        torch.testing.assert_close(torch.mm(a, b).cpu(), a_cpu @ b_cpu)
    compiled = env.stats()["compilations"]
    assert _mm_modes(env) == ["highest"]
    torch.set_float32_matmul_precision("medium")
    for _ in range(3):
        torch.testing.assert_close(torch.mm(a, b).cpu(), a_cpu @ b_cpu)
    assert env.stats()["compilations"] == compiled + 1
    assert _mm_modes(env) == ["highest", "medium"]
    torch.set_float32_matmul_precision("highest")
    hits = env.stats()["op_cache_hits"]
    torch.mm(a, b)
    assert env.stats()["compilations"] == compiled + 1  # the first one again: a hit
    assert env.stats()["op_cache_hits"] == hits + 1


def test_ops_that_read_no_precision_keep_their_keys(env):
    a = torch.randn(5).to("jax")
    for _ in range(3):
        torch.add(a, a)
    compiled = env.stats()["compilations"]
    torch.set_float32_matmul_precision("medium")
    torch.add(a, a)
    assert env.stats()["compilations"] == compiled


def _modes_of(jitted):
    return sorted(mode for p in jitted.programs.values() for (_, mode) in p.compiled)


def test_torchlax_jit_forward_compiles_again_for_a_new_mode():
    layer = torch.nn.Linear(6, 3)
    x = torch.randn(4, 6)
    with torchlax_core.enable():
        model = torch.nn.Linear(6, 3).to("jax")
        model.load_state_dict(layer.state_dict())
        jitted = torchlax.jit(model)
        with torch.no_grad():
            torch.set_float32_matmul_precision("highest")
            for _ in range(3):  # the third call repeats the second without a lookup
                torch.testing.assert_close(jitted(x.to("jax")).cpu(), layer(x))
            assert _modes_of(jitted) == ["highest"]
            torch.set_float32_matmul_precision("high")
            for _ in range(2):
                torch.testing.assert_close(jitted(x.to("jax")).cpu(), layer(x))
    assert _modes_of(jitted) == ["high", "highest"]


def test_torchlax_jit_step_compiles_again_for_a_new_mode():
    with torchlax_core.enable():
        model = torch.nn.Linear(6, 3).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 6).to("jax")

        def step(x):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return loss

        jitted = torchlax.jit(step)
        torch.set_float32_matmul_precision("highest")
        for _ in range(4):
            jitted(x)
        # one program: plain SGD creates no optimizer state, and the .grads the first call
        # creates are discarded unread by the next zero_grad(), so the first call's program is
        # the steady step's
        highest = _modes_of(jitted)
        assert highest == ["highest"]
        torch.set_float32_matmul_precision("medium")
        for _ in range(2):
            jitted(x)
    assert _modes_of(jitted) == [*highest, "medium"]


def test_torch_compile_backend_compiles_again_for_a_new_mode():
    import torchlax_dynamo

    torch._dynamo.reset()
    torchlax_dynamo.counters.clear()
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    compiled = torch.compile(lambda a, b: torch.relu(a @ b), backend="torchlax")
    # "high" and "medium" share Dynamo's graph (it guards on allow_tf32 alone): the backend's
    # program must tell them apart.
    torch.set_float32_matmul_precision("high")
    for _ in range(3):
        torch.testing.assert_close(compiled(a, b), torch.relu(a @ b))
    traces = torchlax_dynamo.counters["xla_traces"]
    torch.set_float32_matmul_precision("medium")
    for _ in range(2):
        torch.testing.assert_close(compiled(a, b), torch.relu(a @ b))
    assert torchlax_dynamo.counters["xla_traces"] == traces + 1
    torch._dynamo.reset()


def test_torchlax_jit_saved_residual_forward_traces_again_for_a_new_mode():
    # A grad-enabled jitted forward whose backward has run saves jax.vjp's residuals in later
    # forwards (one jax.jit of its own): that one keys on the mode too.
    with torchlax_core.enable():
        model = torch.nn.Linear(6, 3).to("jax")
        jitted = torchlax.jit(model)
        x = torch.randn(4, 6).to("jax")
        torch.set_float32_matmul_precision("highest")
        for _ in range(3):
            jitted(x).sum().backward()
        assert any(p.saves_residuals for p in jitted.programs.values())

        # Count traces of the residual-saving forward itself (jax.jit's _cache_size counts
        # only fast-path entries, which a call may not make): a fresh jax.jit over a counting
        # wrapper, traced once at "highest", not again at "highest", once more at "medium".
        traces = []
        for program in jitted.programs.values():
            traced_vjp = program._traced_vjp

            def counting(*args, _traced_vjp=traced_vjp):
                traces.append(args[1])
                return _traced_vjp(*args)

            program.forward_vjp = jax.jit(counting, static_argnums=(0, 1))
        for _ in range(2):
            jitted(x).sum().backward()
        assert traces == ["highest"]
        torch.set_float32_matmul_precision("medium")
        jitted(x).sum().backward()
        assert traces == ["highest", "medium"]
