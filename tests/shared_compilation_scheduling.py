"""pytest-xdist scheduling that runs the tests of one model in one worker, one after another.

Eager tests spend most of their time compiling op signatures, once per process. The tests of
one model (its eager forward, training step, generation, ...) compile many of the same ones:
run in one worker they compile them once (a GPT-2 training step after that model's eager
forward: ~14 instead of ~24 seconds, loaded). ``--dist load`` spreads them over the workers.

pytest-xdist's ``--dist loadgroup`` would do this from ``xdist_group`` marks, but with pytest 9
it never tags the node ids it schedules (it sets ``Item._nodeid``, which pytest 9 no longer
reads), so the groups are named here, from the node ids the controller sees. Every other test
is its own unit, sent one at a time as ``--dist load`` does; the groups go first, largest
first (xdist's ``--loadscope-reorder``, on by default), so that no long group starts last.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Test modules whose tests are grouped by the first part of their parameter id: the model
# ("gpt2" in ``test_forward_eager[gpt2]``, "mlp" in ``test_training_loop_matches_cpu[mlp-adamw]``).
GROUPED_BY_FIRST_PARAMETER = frozenset(
    {"tests/models/test_end_to_end.py", "tests/core/test_training.py"}
)


def group_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: ``path[model]`` or the node id itself."""
    path, _, rest = nodeid.partition("::")
    if path in GROUPED_BY_FIRST_PARAMETER and rest.endswith("]") and "[" in rest:
        first_parameter = rest[rest.index("[") + 1 : -1].split("-")[0]
        return f"{path}[{first_parameter}]"
    return nodeid


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
