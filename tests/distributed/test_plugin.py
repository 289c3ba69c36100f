"""The ``distributed`` plugin loads through its entry point and lowers the c10d ops."""

import torch
import torchlax_core


def test_distributed_plugin_lowers_the_functional_collectives():
    env = torchlax_core.Environment()
    record = next(p for p in env.plugins() if p.name == "distributed")
    assert record.status == "loaded", record.error
    c10d = torch.ops._c10d_functional
    for op in (
        c10d.all_reduce.default,
        c10d.all_gather_into_tensor.default,
        c10d.reduce_scatter_tensor.default,
        c10d.broadcast.default,
        c10d.all_to_all_single.default,
        c10d.wait_tensor.default,
        c10d._wrap_tensor_autograd.default,
        c10d.all_reduce_coalesced.default,
    ):
        lowering = env.lowering_for(op)
        assert lowering is not None and lowering.plugin == "distributed", op
    # in-place and out= overloads come from the functional ones
    assert env.lowering_for(c10d.all_reduce_.default) is not None
