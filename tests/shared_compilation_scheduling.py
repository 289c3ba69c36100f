"""pytest-xdist scheduling that runs tests which compile the same programs in one worker.

Eager tests spend most of their time compiling: each op signature (and, on an op's first call,
each ``jax.numpy`` primitive it runs) is compiled once per process. Tests of one module use the
same shapes, dtypes and ops, so run in one worker they compile them once: ``--dist load``
sends consecutive tests to alternate workers, each compiling them again. Measured on the loaded
2-core machine, ``-n 2``: tests/ops/test_indexing.py + test_reductions.py 2304 -> 1908 XLA
compilations (361 -> 222 compile-seconds summed over the workers) as one unit per module; the
OpInfo eager cases of the ops named s* and c* 2175 -> 1932 compilations as one unit per dtype;
a GPT-2 training step after that model's eager forward ~14 instead of ~24 seconds.

The units (``group_of``):

- each model's tests in the modules of ``GROUPED_BY_FIRST_PARAMETER`` (``[gpt2]``,
  ``[mlp-adamw]``: the first part of the parameter id);
- OpInfo's eager cases per dtype (``test_opinfo[eager-add-float32]`` -> ``[eager-float32]``:
  the ops' samples share shapes, so they share the primitives' executables); its jit cases stay
  single tests (each traces and compiles a program of its own);
- every other module as a whole, except those of ``SINGLE_TESTS`` (their bodies run in fresh
  processes: nothing to share), whose tests are units of their own.

pytest-xdist's ``--dist loadgroup`` would do this from ``xdist_group`` marks, but with pytest 9
it never tags the node ids it schedules (it sets ``Item._nodeid``, which pytest 9 no longer
reads), so the groups are named here, from the node ids the controller sees. Units go out
largest first (xdist's ``--loadscope-reorder``, on by default), so that the big ones start
early and the single tests even out the workers' ends.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Test modules whose tests are grouped by the first part of their parameter id: the model
# ("gpt2" in ``test_forward_eager[gpt2]``, "mlp" in ``test_training_loop_matches_cpu[mlp-adamw]``).
GROUPED_BY_FIRST_PARAMETER = frozenset(
    {"tests/models/test_end_to_end.py", "tests/core/test_training.py"}
)


OPINFO = "tests/ops/test_opinfo.py"
_OPINFO_EAGER = "test_opinfo[eager-"

# Directories and modules whose tests run their bodies in fresh Python processes (examples,
# docs' code blocks, several simulated devices, imports and installs): grouping them shares no
# compilation, and as single units these long tests help even out the workers' ends.
SINGLE_TESTS = (
    "tests/distributed/",
    "tests/docs/",
    "tests/examples/",
    "tests/plugins/",
    "tests/core/test_import.py",
    "tests/core/test_install.py",
    "tests/core/test_isolation.py",
)


def group_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to (see the module's docstring)."""
    path, _, rest = nodeid.partition("::")
    if path in GROUPED_BY_FIRST_PARAMETER and rest.endswith("]") and "[" in rest:
        first_parameter = rest[rest.index("[") + 1 : -1].split("-")[0]
        return f"{path}[{first_parameter}]"
    if path == OPINFO:
        if rest.startswith(_OPINFO_EAGER) and rest.endswith("]"):
            dtype = rest[:-1].rsplit("-", 1)[-1]
            return f"{path}[eager-{dtype}]"
        return nodeid
    if path.startswith(SINGLE_TESTS):
        return nodeid
    return path


class SharedCompilationScheduling(LoadScopeScheduling):
    """``--dist loadscope`` whose scopes are ``group_of`` each test.

    Finished units are dropped from a worker's record: xdist counts a worker's pending tests
    over every unit it ever got, after each test, which with ~3000 single-test units per worker
    costs seconds of the controller's CPU over a run.
    """

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        scope = self._split_scope(self.registered_collections[node][item_index])
        super().mark_test_complete(node, item_index, duration)
        units = self.assigned_work.get(node, {})
        if scope in units and all(units[scope].values()):
            del units[scope]
