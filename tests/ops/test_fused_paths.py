"""torch.nn's inference fast paths (eval() under no_grad) run their fused ATen kernels on jax.

``nn.MultiheadAttention`` then calls ``aten._native_multi_head_attention`` and
``nn.TransformerEncoderLayer`` ``aten._transformer_encoder_layer_fwd``; both are compared with
the same fused kernels on the CPU, eagerly and under jit.
"""

import pytest
import torch
import torchlax
import torchlax_core
from _compare_cpu import assert_same, check, to_jax

aten = torch.ops.aten
B, T, D, HEADS = 2, 5, 16, 4


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        qkv_weight=torch.randn(3 * D, D, generator=g) / 4,
        qkv_bias=torch.randn(3 * D, generator=g),
        proj_weight=torch.randn(D, D, generator=g) / 4,
        proj_bias=torch.randn(D, generator=g),
    )


def _key_padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 3:] = True
    mask[1, 1] = True
    return mask


def _mha(
    query,
    key,
    value,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask,
    need_weights,
    average,
    mask_type,
):
    return aten._native_multi_head_attention(
        query,
        key,
        value,
        D,
        HEADS,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        need_weights,
        average,
        mask_type,
    )


@pytest.mark.parametrize(
    ("mask_kind", "need_weights", "average"),
    [
        (None, True, True),
        (None, False, True),
        ("padding", True, False),
        ("attention", True, True),
        ("generic", False, True),
    ],
)
def test_native_multi_head_attention_matches_cpu(mask_kind, need_weights, average):
    x = torch.randn(B, T, D)
    mask, mask_type = {
        None: (None, None),
        "padding": (_key_padding(), 1),
        "attention": (torch.triu(torch.ones(T, T, dtype=torch.bool), 1), 0),
        "generic": (torch.rand(B, HEADS, T, T) > 0.7, 2),
    }[mask_kind]
    if mask is not None and mask_kind == "generic":
        mask[..., 0] = False  # no row masked out entirely
    w = _weights()
    check(
        lambda x, m, w: _mha(x, x, x, *w.values(), m, need_weights, average, mask_type),
        x,
        mask,
        w,
        atol=1e-5,
    )


def test_native_multi_head_attention_cross_attention():
    q, kv = torch.randn(B, T, D), torch.randn(B, T, D)
    check(lambda q, kv, w: _mha(q, kv, kv, *w.values(), None, True, True, None), q, kv, _weights())


def test_masked_softmax_matches_cpu():
    x = torch.randn(B, HEADS, T, T)
    check(lambda x, m: aten._masked_softmax(x, m, 3, 1), x, _key_padding())
    square = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    check(lambda x, m: aten._masked_softmax(x, m, 3, 0), x, square)


def test_masked_softmax_rejects_a_float_mask_as_cpu():
    x = torch.randn(1, 1, 2, 2)
    with pytest.raises(RuntimeError, match="boolean"):
        aten._masked_softmax(x, torch.zeros(2, 2), 3, 0)
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="boolean"):
        aten._masked_softmax(x.to("jax"), torch.zeros(2, 2, device="jax"), 3, 0)


def _encoder(norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        D, HEADS, 32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _fused_ops_resolved():
    return torchlax_core.default_env()._resolved


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_fast_path_eager_and_jit(norm_first, activation):
    model = _encoder(norm_first, activation)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        expected = model(x)
        with torchlax_core.enable():
            jax_model = model.to("jax")
            x_jax = x.to("jax")
            actual = jax_model(x_jax)
            assert aten._transformer_encoder_layer_fwd.default in _fused_ops_resolved()
            assert_same(actual, expected, atol=2e-5, rtol=1e-5, what="eager")
            assert_same(
                torchlax.jit(jax_model)(x_jax), expected, atol=2e-5, rtol=1e-5, what="torchlax.jit"
            )


def test_transformer_encoder_fast_path_with_masks():
    model = _encoder(False, "relu")
    x = torch.randn(B, T, D)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    padding = _key_padding()
    with torch.no_grad():
        for kwargs in ({"src_key_padding_mask": padding}, {"mask": causal}):
            expected = model(x, **kwargs)
            with torchlax_core.enable():
                jax_model = model.to("jax")
                jax_kwargs = to_jax(kwargs)
                actual = jax_model(x.to("jax"), **jax_kwargs)
                assert_same(actual, expected, atol=2e-5, rtol=1e-5, what=str(list(kwargs)))
            model = model.cpu()


def test_multihead_attention_module_fast_path():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(D, HEADS, batch_first=True).eval()
    x = torch.randn(B, T, D)
    padding = _key_padding()
    with torch.no_grad():
        expected = mha(x, x, x, key_padding_mask=padding)
        with torchlax_core.enable():
            jax_mha = mha.to("jax")
            x_jax = x.to("jax")
            actual = jax_mha(x_jax, x_jax, x_jax, key_padding_mask=padding.to("jax"))
            assert aten._native_multi_head_attention.default in _fused_ops_resolved()
    assert_same(actual, expected, atol=1e-5, rtol=1e-5)
