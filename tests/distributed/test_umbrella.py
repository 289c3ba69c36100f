"""The distributed API is reachable from the umbrella as ``torchlax.distributed`` and
``torchlax.shard``, and loads only on first use."""

import fresh_python
import torchlax_interop.distributed as interop_distributed


def test_umbrella_exports_the_whole_distributed_api():
    import torchlax
    import torchlax.distributed as dist

    assert torchlax.distributed is dist
    assert torchlax.shard is interop_distributed.shard
    public = {n for n in vars(interop_distributed) if not n.startswith("_")}
    public -= {"annotations"}
    missing = sorted(
        n for n in public if getattr(dist, n, None) is not getattr(interop_distributed, n)
    )
    assert not missing, missing
    assert {"distributed", "shard"} <= set(dir(torchlax))


def test_import_torchlax_does_not_import_the_distributed_code():
    code = (
        "import sys, torchlax\n"
        "assert 'torchlax_interop.distributed' not in sys.modules, 'imported eagerly'\n"
        "assert 'transformers' not in sys.modules, 'transformers imported eagerly'\n"
        "from torchlax import distributed\n"
        "assert distributed.make_mesh is sys.modules['torchlax_interop.distributed'].make_mesh\n"
    )
    done = fresh_python.run(["-c", code], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_unknown_attribute_still_raises_attribute_error():
    import pytest
    import torchlax

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        torchlax.not_a_name  # noqa: B018
