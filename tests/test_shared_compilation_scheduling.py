"""The units of work the suite's xdist scheduler sends to one worker (shared_compilation_scheduling)."""

from shared_compilation_scheduling import group_of


def test_tests_that_compile_the_same_programs_share_a_unit():
    units = {
        "tests/models/test_end_to_end.py::test_forward_eager[gpt2]": (
            "tests/models/test_end_to_end.py[gpt2]"
        ),
        "tests/core/test_training.py::test_training_loop_matches_cpu[mlp-adamw]": (
            "tests/core/test_training.py[mlp]"
        ),
        "tests/ops/test_opinfo.py::test_opinfo[eager-nn.functional.conv2d-float32]": (
            "tests/ops/test_opinfo.py[eager-float32]"
        ),
        "tests/ops/test_opinfo.py::test_opinfo[eager-as_strided.partial_views-bfloat16]": (
            "tests/ops/test_opinfo.py[eager-bfloat16]"
        ),
        "tests/ops/test_nn.py::test_activation[gelu]": "tests/ops/test_nn.py",
        "tests/core/test_views.py::test_resize_grows_as_pytorch": "tests/core/test_views.py",
    }
    for nodeid, unit in units.items():
        assert group_of(nodeid) == unit, nodeid


def test_jit_cases_and_tests_in_fresh_processes_are_units_of_their_own():
    for nodeid in (
        "tests/ops/test_opinfo.py::test_opinfo[jit-add-float32]",
        "tests/ops/test_opinfo.py::test_float16_selection",
        "tests/examples/test_examples.py::test_example_runs[sharding]",
        "tests/docs/test_code_blocks.py::test_code_blocks_run[docs/distributed.md]",
        "tests/distributed/test_shard.py::test_fsdp_training_step_equals_unsharded",
        "tests/core/test_install.py::test_core_installs_alone_and_asks_for_torchlax_ops",
    ):
        assert group_of(nodeid) == nodeid
