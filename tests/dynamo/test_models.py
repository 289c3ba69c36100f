"""Whole models compiled with backend="torchlax", against eager PyTorch on the CPU."""

import copy

import pytest
import torch
import torchlax_core
import torchlax_dynamo
from dynamo_helpers import assert_same, to_jax

counters = torchlax_dynamo.counters


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def cnn():
    torch.manual_seed(0)
    return SmallCNN()


def train_steps(model, x, target, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def check_state(actual: torch.nn.Module, expected: torch.nn.Module, **tol):
    for (name, a), (_, e) in zip(
        actual.state_dict().items(), expected.state_dict().items(), strict=True
    ):
        assert_same(a, e, **tol), name


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_cnn_with_batchnorm_inference(on_jax):
    model = cnn().eval()
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(to_jax(model) if on_jax else model, backend="torchlax")
    with torch.no_grad():
        out = compiled(to_jax(x) if on_jax else x)
        assert_same(out, model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_cnn_with_batchnorm_training_updates_running_stats(on_jax):
    model = cnn()
    eager = copy.deepcopy(model)
    x, target = torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 1, 4])
    trained = to_jax(model) if on_jax else model
    compiled = torch.compile(trained, backend="torchlax")
    cx, ct = (to_jax(x), to_jax(target)) if on_jax else (x, target)
    losses = train_steps(compiled, cx, ct)
    expected = train_steps(eager, x, target)
    for loss, e in zip(losses, expected, strict=True):
        assert_same(loss, e, rtol=1e-4, atol=1e-5)
    # weights, running_mean/var and num_batches_tracked, as eager BatchNorm leaves them
    check_state(trained, eager, rtol=1e-4, atol=1e-5)
    assert int(trained.bn1.num_batches_tracked) == 2
    assert counters["eager_nodes"] == 0


def test_batchnorm_running_stats_in_no_grad_forward():
    # Without autograd AOT keeps the buffer updates inside the program (copy_ into inputs).
    model = cnn()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 8, 8)
    compiled = torch.compile(model, backend="torchlax")
    with torch.no_grad():
        for _ in range(2):
            assert_same(compiled(x), eager(x), rtol=1e-4, atol=1e-5)
    check_state(model, eager, rtol=1e-4, atol=1e-5)


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.slow
@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_gpt2_forward(on_jax):
    model = tiny_gpt2()
    ids = torch.randint(0, 64, (2, 12))
    compiled = torch.compile(to_jax(model) if on_jax else model, backend="torchlax")
    with torch.no_grad():
        out = compiled(to_jax(ids) if on_jax else ids).logits
        expected = model(ids).logits
    assert type(out) is (torchlax_core.Tensor if on_jax else torch.Tensor)
    assert_same(out, expected, rtol=1e-4, atol=1e-4)
    assert counters["eager_nodes"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_gpt2_training_step(on_jax):
    model = tiny_gpt2().train()
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 12))
    trained = to_jax(model) if on_jax else model
    compiled = torch.compile(trained, backend="torchlax")

    def step(m, opt, ids):
        opt.zero_grad()
        loss = m(ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.detach()

    opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    cids = to_jax(ids) if on_jax else ids
    for _ in range(2):
        assert_same(step(compiled, opt, cids), step(eager, eager_opt, ids), rtol=1e-4, atol=1e-4)
    check_state(trained, eager, rtol=1e-3, atol=1e-4)
    assert counters["eager_nodes"] == 0  # attention's backward too: no fused CPU kernel


def _heads(x):  # (B, L, H*E) -> (B, H, L, E), a transposed view as in GPT-2's attention
    return x.view(2, 5, 3, 4).transpose(1, 2)


def attention_block(x):
    q, k, v = (_heads(t) for t in x.split(12, dim=2))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    merged = out.transpose(1, 2)
    # Without grad, a view: PyTorch's fused output is laid out as q is. (With grad the backend
    # takes the math path, whose output is row-major: only reshape works there.)
    return merged.reshape(2, 5, 12) if x.requires_grad else merged.view(2, 5, 12)


def _graph_targets(monkeypatch) -> list:
    """The targets of every graph the backend compiles from now on (recorded, then compiled)."""
    from torchlax_dynamo import _backend

    targets = []
    compile_graph = _backend.compile_graph

    def recording(gm, env, name):
        targets.extend(n.target for n in gm.graph.nodes)
        return compile_graph(gm, env, name)

    monkeypatch.setattr(_backend, "compile_graph", recording)
    return targets


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_attention_fused_op_kept_without_backward(grad, monkeypatch):
    targets = _graph_targets(monkeypatch)
    x = torch.randn(2, 5, 36, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        out = torch.compile(attention_block, backend="torchlax")(x)
        expected = attention_block(x)
    assert_same(out, expected, rtol=1e-5, atol=1e-6)
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    # A backward would need the fused kernel's own backward: the math path is taken then.
    assert (fused in targets) is not grad


def _fused_block(x):  # attention on heads split from x, merged back with a view
    q, k, v = (_heads(t) for t in x.split(12, dim=2))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).view(2, 5, 12)  # a view: the output is laid out as q is


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_attention_on_jax_tensors_is_the_overrideable_fused_op(grad, monkeypatch):
    # The jax device's attention is PyTorch's overrideable fused op and, with a backward, its
    # fused backward, in the graphs too (not the math path's matmuls and softmax).
    targets = _graph_targets(monkeypatch)
    x = torch.randn(2, 5, 36)
    xj = to_jax(x).requires_grad_(grad)
    x.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = torch.compile(_fused_block, backend="torchlax")(xj)
        expected = _fused_block(x)
    assert_same(out, expected, rtol=1e-5, atol=1e-6)
    assert out.stride() == expected.stride()
    ops = torch.ops.aten
    assert ops._scaled_dot_product_fused_attention_overrideable.default in targets
    assert ops._softmax.default not in targets
    if grad:  # (the backward graph is compiled when backward first runs)
        weights = torch.randn(2, 5, 12)
        (out * to_jax(weights)).sum().backward()
        (expected * weights).sum().backward()
        assert_same(xj.grad, x.grad, rtol=1e-5, atol=1e-6)
    backward = ops._scaled_dot_product_fused_attention_overrideable_backward.default
    assert (backward in targets) is grad


def test_fused_attention_output_strides_match_pytorch():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchlax_dynamo._program import run_graph

    def fused(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)

    merged = [torch.randn(2, 5, 12) for _ in range(3)]
    q, k, v = map(_heads, merged)
    gm = make_fx(fused, tracing_mode="fake")(q, k, v)
    env = torchlax_core.current_env()
    with torchlax_core.enable(env):
        # The same transposed views of torchlax Tensors (``to_jax`` of a view is row-major).
        outs = run_graph(gm, [_heads(to_jax(t)) for t in merged], env)
    for out, expected in zip(outs, fused(q, k, v), strict=True):
        assert out.stride() == expected.stride()
        assert_same(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu_inputs", "jax_inputs"])
def test_compiled_fused_attention_returns_pytorchs_strides(on_jax):
    # Graph outputs laid out other than row-major (here as the query is) keep their strides.
    def fused(a, b, c):
        q, k, v = map(_heads, (a, b, c))
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)

    xs = [torch.randn(2, 5, 12) for _ in range(3)]
    with torch.no_grad():
        outs = torch.compile(fused, backend="torchlax")(*(map(to_jax, xs) if on_jax else xs))
    for out, expected in zip(outs, fused(*xs), strict=True):
        assert (out.stride(), out._base) == (expected.stride(), None)
        assert_same(out, expected, rtol=1e-5, atol=1e-6)


def test_a_broadcast_input_gives_eagers_strides():
    # An expanded input is traced with its stride-0 dimension (the core's ``traced_strides``):
    # TensorIterator lays out its results row-major as a stride-0 dimension tells it no order
    # (it was traced with the dense order of its strides, and ``x * 2`` came back transposed).
    def f(x):
        return x * 2

    x = torch.randn(3).expand(4, 3)
    out = torch.compile(f, backend="torchlax")(to_jax(torch.randn(3)).expand(4, 3))
    assert out.stride() == f(x).stride() == (3, 1)


def test_a_transposed_broadcast_input_gives_eagers_strides():
    # Traced row-major, the expanded input's transpose would be (1, 4) and ``+ 1`` follow it;
    # its stride-0 dimension tells TensorIterator nothing, so eagerly the result is row-major.
    def f(x):
        return x.t() + 1

    x = torch.randn(4, 1)
    out = torch.compile(f, backend="torchlax")(to_jax(x).expand(4, 3))
    assert out.stride() == f(x.expand(4, 3)).stride() == (4, 1)
    assert_same(out, f(x.expand(4, 3)))
