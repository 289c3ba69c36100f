"""No source file under packages/ is over 1,000 lines: a file that grows past it is split by
family or concern (as the ops' lowerings and the core's dispatch are), so that a reader finds
where something lives from the file names."""

from __future__ import annotations

from pathlib import Path

_PACKAGES = Path(__file__).resolve().parents[1] / "packages"
_MAX_LINES = 1000


def _too_long(root: Path) -> dict[str, int]:
    lengths = {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for path in root.rglob("*.py")
    }
    return {name: n for name, n in lengths.items() if n > _MAX_LINES}


def test_no_source_file_is_over_1000_lines():
    assert len(list(_PACKAGES.rglob("*.py"))) > 50  # the walk finds the packages' sources
    assert _too_long(_PACKAGES) == {}, "split these by family or concern"


def test_the_check_counts_lines(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (_MAX_LINES + 1))
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * _MAX_LINES)
    assert _too_long(tmp_path) == {"pkg/long.py": _MAX_LINES + 1}
