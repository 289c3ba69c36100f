"""Zero-copy promotion: from_torch / to_torch cost the same for 1 KiB and 256 MiB.

    uv run python benchmarks/dlpack.py

Each row is the median of repeated calls. ``from_torch`` shares the tensor's memory with JAX
through DLPack and makes it copy-on-write; ``to_torch`` shares a JAX array's memory with a
torch tensor. Neither touches the data, so the time does not grow with the size. For scale,
the last column is one plain copy of the same data (``tensor.clone()``).
"""

from __future__ import annotations

import statistics
import time

import torch
import torchlax


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    sizes = {"1 KiB": 1024, "256 MiB": 256 * 1024 * 1024}
    rows = []
    for label, nbytes in sizes.items():
        tensor = torch.ones(nbytes // 4)
        repeat = 50
        # Each promotion's array is dropped at once, so every call is a full first promotion
        # (export, copy-on-write setup), not a reuse of the previous call's array.
        promote_us = _median_us(lambda t=tensor: torchlax.from_torch(t), repeat)
        x = torchlax.from_torch(tensor)
        back_us = _median_us(lambda x=x: torchlax.to_torch(x), repeat)
        shared = torchlax.to_torch(x).data_ptr() == x.jax().unsafe_buffer_pointer()
        clone_us = _median_us(lambda t=tensor: t.clone(), 5)
        rows.append((label, promote_us, back_us, shared, clone_us))
        del x, tensor

    print(f"{'size':>8} | {'from_torch':>12} | {'to_torch':>12} | {'shared':>6} | {'clone()':>12}")
    print("-" * 64)
    for label, promote_us, back_us, shared, clone_us in rows:
        print(
            f"{label:>8} | {promote_us:9.1f} us | {back_us:9.1f} us | {str(shared):>6} | "
            f"{clone_us:9.1f} us"
        )
    small, large = rows
    ratio = max(large[1] / small[1], large[2] / small[2])
    print(f"\n256 MiB / 1 KiB time ratio: {ratio:.1f}x for 262144x the data (zero copy).")
    assert ratio < 20, "a promotion or its way back is copying data"


if __name__ == "__main__":
    main()
