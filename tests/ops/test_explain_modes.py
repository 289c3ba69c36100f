"""torchlax.explain lists every missing op of one forward, in the caller's grad mode."""

import torch
import torchlax_ops

aten = torch.ops.aten


@torch.library.custom_op("torchlax_test::explain_cube", mutates_args=())
def _cube(x: torch.Tensor) -> torch.Tensor:
    return x**3


@_cube.register_fake
def _(x):
    return torch.empty_like(x)


def test_every_missing_op_is_listed_even_without_meta_kernels():
    # aten._add_relu has no lowering; its Scalar overload has no meta kernel either.
    def program(x):
        y = aten._add_relu.Scalar(x, 0.5)
        z = aten._add_relu.Tensor(y, x)
        return _cube(z).sum()

    explanation = torchlax_ops.explain(program, torch.randn(3, 4))
    assert explanation.error is None
    assert [u.name for u in explanation.missing] == [
        "aten._add_relu.Scalar",
        "aten._add_relu.Tensor",
        "torchlax_test.explain_cube.default",
    ]
    assert "aten.sum.default" in [u.name for u in explanation.ops]
    assert "INTERNAL ASSERT" not in str(explanation)


def test_explain_follows_the_callers_grad_mode():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 3, 8)
    fused = "aten._transformer_encoder_layer_fwd.default"
    with_grad = torchlax_ops.explain(model, x)
    with torch.no_grad():
        without_grad = torchlax_ops.explain(model, x)
    assert fused not in [u.name for u in with_grad.ops] and with_grad.grad_enabled
    assert [u.name for u in without_grad.ops] == [fused] and not without_grad.grad_enabled
    assert "gradients disabled" in str(without_grad)
