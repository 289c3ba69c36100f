"""functional: an nn.Module as a pure JAX function, trained with jax.grad and optax."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torchlax_interop import functional


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)


def test_params_are_the_module_state_shared():
    model = _mlp()
    model.register_buffer("counter", torch.arange(3))
    address = model[0].weight.data_ptr()  # read before: after promotion it is copy-on-write
    params, buffers, _ = functional(model)
    assert set(params) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(buffers) == {"counter"}
    assert buffers["counter"].dtype == jnp.int64
    assert params["0.weight"].unsafe_buffer_pointer() == address
    np.testing.assert_array_equal(np.asarray(params["2.bias"]), model[2].bias.detach().numpy())


def test_forward_matches_the_module():
    model = _mlp()
    x, _ = _data()
    params, _, fn = functional(model)
    out = fn(params, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(out), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    out = jax.jit(fn)(params, x.numpy())
    np.testing.assert_allclose(np.asarray(out), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_new_params_are_used_and_the_module_is_untouched():
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    params, _, fn = functional(model)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    out = fn(zeros, jnp.ones((3, 4)))
    np.testing.assert_array_equal(np.asarray(out), np.zeros((3, 2)))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_tied_weights_appear_once_and_stay_tied():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(3, 3, bias=False)
            self.head = torch.nn.Linear(3, 3, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, x):
            return self.head(self.embed(x))

    model = Tied()
    params, _, fn = functional(model)
    assert list(params) == ["embed.weight"]  # (no buffers)
    w = jnp.eye(3) * 2
    out = fn({"embed.weight": w}, jnp.ones((1, 3)))
    np.testing.assert_allclose(np.asarray(out), [[4.0, 4.0, 4.0]])  # both layers use w


def test_grad_matches_torch_autograd():
    model = _mlp()
    x, y = _data()
    params, _, fn = functional(model)

    def loss(params):
        return jnp.mean((fn(params, x.numpy()) - y.numpy()) ** 2)

    grads = jax.grad(loss)(params)
    torch.nn.functional.mse_loss(model(x), y).backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_ten_optax_steps_match_torch_training(optimizer):
    model = _mlp(1)
    reference = copy.deepcopy(model)
    x, y = _data(1)
    params, _, fn = functional(model)
    params = {k: v for k, v in params.items()}
    lr = 0.05 if optimizer == "sgd" else 0.01
    tx = optax.sgd(lr) if optimizer == "sgd" else optax.adam(lr)
    state = tx.init(params)

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((fn(p, x) - y) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(
        reference.parameters(), lr=lr
    )
    for _ in range(10):
        params, state, loss = step(params, state, x.numpy(), y.numpy())
        opt.zero_grad()
        ref_loss = torch.nn.functional.mse_loss(reference(x), y)
        ref_loss.backward()
        opt.step()
        np.testing.assert_allclose(float(loss), ref_loss.item(), rtol=1e-4)
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(
            np.asarray(params[name]), p.detach().numpy(), rtol=1e-4, atol=1e-5
        )


def test_vmap_over_the_functional_form():
    model = _mlp()
    params, _, fn = functional(model)
    xs = torch.randn(5, 3, 4)
    batched = jax.vmap(lambda x: fn(params, x))(xs.numpy())
    want = torch.stack([model(x) for x in xs]).detach().numpy()
    np.testing.assert_allclose(np.asarray(batched), want, rtol=1e-5, atol=1e-6)


def test_frozen_parameters_and_buffers_are_state_and_new_state_is_used():
    model = _mlp()
    model[0].bias.requires_grad_(False)
    model.register_buffer("shift", torch.zeros(2))
    forward = model.forward
    model.forward = lambda x: forward(x) + model.shift
    params, buffers, fn = functional(model)
    assert set(params) == {"0.weight", "2.weight", "2.bias"}
    assert set(buffers) == {"0.bias", "shift"}
    x = jnp.ones((3, 4))
    base = fn(params, x)
    shifted = fn({**params, **buffers, "shift": jnp.full((2,), 5.0)}, x)
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(base) + 5.0, rtol=1e-6)


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=50,
        max_position_embeddings=16,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config).eval()


def test_hugging_face_outputs_are_jax_pytrees_and_grad_skips_int64_buffers():
    model = _tiny_bert()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 2])
    params, buffers, fn = functional(model)
    assert "bert.embeddings.position_ids" in buffers  # int64: not differentiable
    assert all(jnp.issubdtype(v.dtype, jnp.floating) for v in params.values())

    out = jax.jit(fn)(params, ids.numpy())  # a ModelOutput comes back through jax.jit
    assert type(out).__name__ == "SequenceClassifierOutput"
    assert isinstance(out.logits, jax.Array)
    reference = model(ids)
    np.testing.assert_allclose(
        np.asarray(out.logits), reference.logits.detach().numpy(), rtol=1e-5, atol=1e-5
    )

    def loss(params):
        logits = fn(params, ids.numpy()).logits
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(2), labels.numpy()])

    grads = jax.grad(loss)(params)
    torch.nn.functional.cross_entropy(reference.logits, labels).backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(
            np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name
        )


def test_dataclass_outputs_are_converted():
    import dataclasses

    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor
        extra: dict

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            h = self.lin(x)
            return Out(h, {"doubled": (h * 2,)})

    model = Model()
    params, _, fn = functional(model)
    out = jax.jit(fn)(params, jnp.ones((3, 4)))
    assert isinstance(out, Out) and isinstance(out.extra["doubled"][0], jax.Array)
    want = model(torch.ones(3, 4)).hidden.detach().numpy()
    np.testing.assert_allclose(np.asarray(out.hidden), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.extra["doubled"][0]), 2 * want, rtol=1e-6)


def test_dropout_under_jax_jit_draws_from_the_key_argument():
    model = torch.nn.Dropout(0.5).train()
    _, _, fn = functional(model)
    step = jax.jit(fn)
    x = jnp.ones((64, 64))
    a = step({}, x, key=jax.random.key(0))
    b = step({}, x, key=jax.random.key(1))
    again = step({}, x, key=jax.random.key(0))
    assert not np.array_equal(np.asarray(a), np.asarray(b))  # a fresh mask per key
    np.testing.assert_array_equal(np.asarray(a), np.asarray(again))  # the key decides it
    assert set(np.unique(np.asarray(a)).tolist()) <= {0.0, 2.0}  # kept values scaled by 1/(1-p)
    assert 0.4 < float(jnp.mean(a == 0)) < 0.6
    eager = fn({}, x, key=jax.random.key(0))  # eagerly the same key gives the same mask
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(a))


def test_dropout_under_jax_jit_without_a_key_raises_instead_of_freezing_the_mask():
    _, _, fn = functional(torch.nn.Dropout(0.5).train())
    with pytest.raises(RuntimeError, match="key"):
        jax.jit(fn)({}, jnp.ones((8, 8)))


_ACCELERATOR_STANDIN = """
import jax, torch, torchlax_core
from torchlax_core import hookimpl
from torchlax_interop import functional

host, standin = jax.devices()  # standin plays a TPU: the 'jax' device, not where torch's memory is


class Placement:
    @hookimpl
    def torchlax_device_placement(self, device, env):
        return standin if device is not None and device.type == "jax" else None


torchlax_core.current_env().register_plugin(Placement(), "standin")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
model.register_buffer("scale", torch.ones(2))
params, buffers, fn = functional(model)
state = {**params, **buffers}
assert {d for a in state.values() for d in a.devices()} == {standin}, state
x = jax.device_put(jax.numpy.ones((3, 4)), standin)
grads = jax.jit(jax.grad(lambda p: fn(p, x).sum()))(params)
assert {d for g in grads.values() for d in g.devices()} == {standin}
expected = model(torch.ones(3, 4)).detach().numpy()
assert abs(jax.device_get(fn(params, x)) - expected).max() < 1e-6
print("ok")
"""


def test_a_cpu_module_goes_to_the_jax_device_when_that_is_not_the_host():
    """On a TPU VM, ``functional(cpu_module)`` shared its tensors as arrays on JAX's CPU, so a
    ``jax.jit`` of a step over them compiled and ran on the host (whose RAM the step's
    activations then filled). The arrays go to the ``jax`` device instead: played here by a
    second host device, to which a placement plugin maps ``jax``."""
    import os

    import fresh_python

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    result = fresh_python.run(["-c", _ACCELERATOR_STANDIN], env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.parametrize(
    "pool", [torch.nn.MaxPool2d(2), torch.nn.AdaptiveMaxPool2d(3)], ids=["max", "adaptive_max"]
)
def test_max_pooling_grad_under_jax_jit_without_64_bit_mode(pool):
    # The pooling's int64 indices stay inside the program: a ResNet trains under the caller's
    # jax.jit in JAX's default 32-bit mode (docs/interop.md says what does need 64-bit mode).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), pool, torch.nn.Flatten())
    x = torch.randn(2, 3, 9, 9)
    params, _, fn = functional(model)
    assert not jax.config.jax_enable_x64
    grads = jax.jit(jax.grad(lambda p: jnp.sum(fn(p, x.numpy()) ** 2)))(params)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(grads[name]), p.grad.numpy(), rtol=1e-4, atol=1e-4)
