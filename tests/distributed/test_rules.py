"""Sharding rule sets: first match wins, Megatron and FSDP layouts, clear errors (no devices)."""

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P
from torchlax_interop.distributed import fsdp_rule, fsdp_rules, megatron_rules, spec_for

MESH = AbstractMesh((2, 4), ("data", "model"))


def test_first_matching_rule_wins_and_unmatched_is_replicated():
    rules = [(r"\.weight$", P("model", None)), (r"proj\.weight$", P(None, "model"))]
    assert spec_for("q_proj.weight", (8, 8), MESH, rules) == P("model", None)
    assert spec_for("q_proj.bias", (8,), MESH, rules) == P()


def test_a_callable_rule_may_decline():
    rules = [("weight", lambda name, shape, mesh: None), ("weight", P("data"))]
    assert spec_for("w.weight", (4, 4), MESH, rules) == P("data")


@pytest.mark.parametrize(
    "name, shape, spec",
    [
        ("model.layers.0.self_attn.q_proj.weight", (64, 32), P("model", None)),
        ("model.layers.0.self_attn.k_proj.bias", (64,), P("model")),
        ("model.layers.0.self_attn.o_proj.weight", (32, 64), P(None, "model")),
        ("model.layers.0.self_attn.o_proj.bias", (32,), P()),
        ("model.layers.0.mlp.gate_proj.weight", (128, 32), P("model", None)),
        ("model.layers.0.mlp.up_proj.weight", (128, 32), P("model", None)),
        ("model.layers.0.mlp.down_proj.weight", (32, 128), P(None, "model")),
        ("model.embed_tokens.weight", (1000, 32), P("model", None)),
        ("lm_head.weight", (1000, 32), P("model", None)),
        ("model.norm.weight", (32,), P()),
        # torch.nn.TransformerEncoderLayer
        ("layers.0.self_attn.in_proj_weight", (96, 32), P("model", None)),
        ("layers.0.self_attn.in_proj_bias", (96,), P("model")),
        ("layers.0.self_attn.out_proj.weight", (32, 32), P(None, "model")),
        ("layers.0.linear1.weight", (64, 32), P("model", None)),
        ("layers.0.linear2.weight", (32, 64), P(None, "model")),
        # GPT-2's Conv1D stores (in, out)
        ("transformer.h.0.attn.c_attn.weight", (32, 96), P(None, "model")),
        ("transformer.h.0.attn.c_attn.bias", (96,), P("model")),
        ("transformer.h.0.attn.c_proj.weight", (32, 32), P("model", None)),
        ("transformer.h.0.mlp.c_fc.weight", (32, 128), P(None, "model")),
        ("transformer.wte.weight", (1000, 32), P("model", None)),
    ],
)
def test_megatron_rules(name, shape, spec):
    assert spec_for(name, shape, MESH, megatron_rules("model")) == spec


def test_megatron_with_a_data_axis_fsdp_shards_the_rest():
    rules = megatron_rules("model", data_axis="data")
    assert spec_for("model.norm.weight", (32,), MESH, rules) == P("data")
    assert spec_for("q_proj.weight", (64, 32), MESH, rules) == P("model", None)


@pytest.mark.parametrize(
    "shape, spec",
    [
        ((64, 32), P("data")),  # largest dimension
        ((32, 64), P(None, "data")),
        ((32, 32), P("data")),  # ties: the first
        ((7, 6), P(None, "data")),  # the largest that divides
        ((7, 5), P()),  # none divides: replicated
        ((), P()),
        ((1,), P()),
    ],
)
def test_fsdp_rule_shards_the_largest_divisible_dimension(shape, spec):
    assert fsdp_rule("data")("x", shape, MESH) == spec
    assert spec_for("x", shape, MESH, fsdp_rules("data")) == spec


def test_rules_that_do_not_fit_say_why():
    with pytest.raises(ValueError, match="does not divide evenly"):
        spec_for("q_proj.weight", (30, 32), MESH, megatron_rules("model"))
    with pytest.raises(ValueError, match="names mesh axis 'tensor'"):
        spec_for("w", (8, 8), MESH, [("w", P("tensor"))])
    with pytest.raises(ValueError, match="names 2 dimensions"):
        spec_for("b", (8,), MESH, [("b", P("data", "model"))])
