"""torchvision's detection ops on jax against torchvision's CPU kernels: values, dtypes, shapes,
gradients (torchvision's backward ops), and jit where the output shape is static."""

import pytest
import torch
import torchlax_core
from _compare_cpu import check, grads_match, run_jit, to_jax

torchvision = pytest.importorskip("torchvision")
ops = torchvision.ops

# Boxes inside, across and far outside the 10x12 feature map, and one under a pixel.
ROIS = [
    [0, 1.3, 2.2, 7.9, 8.1],
    [1, -2.0, 0.5, 11.5, 9.7],
    [0, 3.0, 3.0, 3.4, 3.2],
    [1, 0.0, 0.0, 30.0, 30.0],
]


def _inputs(channels=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, channels, 10, 12, generator=g), torch.tensor(ROIS)


@pytest.mark.parametrize(
    ("sampling_ratio", "aligned", "scale"),
    [(2, False, 1.0), (3, True, 0.5), (0, True, 1.0), (-1, False, 0.7)],
)
def test_roi_align_matches_cpu(sampling_ratio, aligned, scale):
    x, rois = _inputs()
    check(
        lambda x, r: ops.roi_align(x, r, (3, 4), scale, sampling_ratio, aligned),
        x,
        rois,
        jit=sampling_ratio > 0,
    )


def test_roi_align_takes_a_list_of_boxes_per_image():
    x, rois = _inputs()
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    check(lambda x, b: ops.roi_align(x, b, 2, 1.0, 2), x, boxes)


def test_roi_align_adaptive_sampling_under_jit_is_a_clear_error():
    x, rois = _inputs()
    with pytest.raises(RuntimeError, match="sampling_ratio > 0"):
        run_jit(lambda x, r: ops.roi_align(x, r, 2, 1.0, 0), *to_jax((x, rois)))


@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_ps_roi_align_matches_cpu(sampling_ratio):
    x, rois = _inputs()
    check(
        lambda x, r: ops.ps_roi_align(x, r, (2, 2), 1.0, sampling_ratio),
        x,
        rois,
        jit=sampling_ratio > 0,
    )
    check(
        lambda x, r: torch.ops.torchvision.ps_roi_align(x, r, 1.0, 2, 2, sampling_ratio),
        x,
        rois,
        jit=False,
    )  # the raw op's channel mapping too


def test_roi_pool_matches_cpu():
    x, rois = _inputs()
    check(lambda x, r: ops.roi_pool(x, r, (3, 4), 0.7), x, rois)
    check(lambda x, r: torch.ops.torchvision.roi_pool(x, r, 1.0, 3, 4), x, rois)  # argmax too


def test_roi_ops_gradients_match_cpu():
    x, rois = _inputs()
    grads_match(lambda x, r: ops.roi_align(x, r, (3, 4), 1.0, 2, True).pow(2).sum(), [x, rois])
    grads_match(lambda x, r: ops.ps_roi_align(x, r, (2, 2), 1.0, 2).pow(2).sum(), [x, rois])
    grads_match(lambda x, r: ops.roi_pool(x, r, (3, 4), 0.7).pow(2).sum(), [x, rois])


def _deform_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 7, 8, generator=g)
    weight = torch.randn(6, 2, 3, 3, generator=g)
    offset = torch.randn(2, 2 * 2 * 9, 4, 2, generator=g) * 2  # offset_groups = 2
    mask = torch.rand(2, 2 * 9, 4, 2, generator=g)
    bias = torch.randn(6, generator=g)
    return x, offset, weight, bias, mask


def _deform(x, offset, weight, bias, mask):
    return ops.deform_conv2d(
        x, offset, weight, bias, stride=(2, 3), padding=(1, 1), dilation=(1, 2), mask=mask
    )


def test_deform_conv2d_matches_cpu():
    check(_deform, *_deform_inputs(), atol=1e-4)
    x, _, _, bias, _ = _deform_inputs()
    offset = torch.randn(2, 18, 7, 8)
    weight = torch.randn(6, 4, 3, 3)
    check(
        lambda x, o, w, b: ops.deform_conv2d(x, o, w, b, padding=1),
        x,
        offset,
        weight,
        bias,
        atol=1e-4,
    )


def test_deform_conv2d_gradients_match_cpu():
    grads_match(lambda *a: _deform(*a).pow(2).sum(), list(_deform_inputs()), atol=1e-3, rtol=1e-4)


def _boxes(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    boxes = torch.rand(n, 4, generator=g) * 20
    boxes[:, 2:] += boxes[:, :2]
    return boxes, torch.rand(n, generator=g)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
def test_nms_matches_cpu(threshold):
    boxes, scores = _boxes()
    check(lambda b, s: ops.nms(b, s, threshold), boxes, scores, jit=False)
    idxs = torch.arange(60) % 3
    check(lambda b, s, i: ops.batched_nms(b, s, i, threshold), boxes, scores, idxs, jit=False)


def test_nms_ties_and_empty_input():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60.0]])
    scores = torch.tensor([0.5, 0.5, 0.5])  # equal scores: the first box wins, as on CPU
    check(lambda b, s: ops.nms(b, s, 0.5), boxes, scores, jit=False)
    check(lambda b, s: ops.nms(b, s, 0.5), torch.zeros(0, 4), torch.zeros(0), jit=False)


def test_nms_under_jit_is_a_clear_error():
    boxes, scores = _boxes()
    with pytest.raises(RuntimeError, match="eagerly"):
        run_jit(lambda b, s: ops.nms(b, s, 0.5), *to_jax((boxes, scores)))


def test_torchvision_ops_need_no_cpu_fallback():
    # The ops conftest turns the CPU fallback off: reaching here means the lowerings answered.
    assert torchlax_core.default_env().config.fallback_to_torch is False
