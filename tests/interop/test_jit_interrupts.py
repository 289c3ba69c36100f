"""torchlax.jit's interrupt sweep (jit_interrupts_sweep.py), run in a pytest process of its own.

The sweep raises an exception from a trace function at each line of jit's modules in turn. At
some of those line events CPython skips a with block's ``__exit__`` (its exit code is attributed
to the with line), leaving that process's context state set (the trace flag, the state lock)
for every test after it; so it runs where nothing comes after it.
"""

from pathlib import Path

import fresh_python
import pytest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_interrupt_sweep_in_a_process_of_its_own():
    here = Path(__file__).parent
    # forked from a server that has imported torch and JAX (tests/fresh_python.py): a new
    # process all the same, whose left-over context state ends with it
    result = fresh_python.run(
        [
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            str(here / "jit_interrupts_sweep.py"),
        ],
        cwd=here.parent.parent,
        timeout=850,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "5 passed" in result.stdout, result.stdout[-3000:]
