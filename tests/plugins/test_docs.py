"""docs/plugins.md's hook table stays in step with hookspecs.py."""

from __future__ import annotations

import inspect
from pathlib import Path

from torchlax_core import hookspecs

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def hookspec_functions():
    return {
        name: fn
        for name, fn in vars(hookspecs).items()
        if name.startswith("torchlax_") and callable(fn)
    }


def test_every_hookspec_is_documented_with_its_summary():
    table = DOC.read_text().split("## Hook reference", 1)[1]
    for name, fn in hookspec_functions().items():
        params = ", ".join(inspect.signature(fn).parameters)
        row = next((line for line in table.splitlines() if f"`{name}({params})`" in line), None)
        assert row is not None, f"{name} is missing from docs/plugins.md"
        summary = inspect.getdoc(fn).splitlines()[0].replace("``", "`")
        assert summary in row, f"docs/plugins.md's summary of {name} differs from hookspecs.py"
        opts = fn.torchlax_spec
        kind = (
            "historic"
            if opts["historic"]
            else "first result"
            if opts["firstresult"]
            else "all called"
        )
        assert f"| {kind} |" in row, name
        deprecated = opts.get("warn_on_impl") is not None
        assert deprecated == summary.startswith("Deprecated:"), f"{name}: say it is deprecated"


def test_no_undocumented_hooks_in_the_table():
    table = DOC.read_text().split("## Hook reference", 1)[1]
    documented = {
        line.split("`")[1].split("(")[0]
        for line in table.splitlines()
        if line.startswith("| `torchlax_")
    }
    assert documented == set(hookspec_functions())
