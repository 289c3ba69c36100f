"""Export a small PyTorch CNN once, then serve it from a process that has no PyTorch.

    uv run python examples/export_and_serve.py [OUT_DIR]

Step 1 (needs torch + torchlax): export with a dynamic batch dimension and save the artifact.
Step 2 (needs only jax + numpy): a fresh interpreter, in which `import torch` fails, loads the
artifact and answers requests of several batch sizes; we check its answers against PyTorch.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
import torchlax_export
from torch import nn
from torch.export import Dim


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, images):
        return self.head(self.features(images).mean(dim=(2, 3)))


SERVER = textwrap.dedent(
    """
    import sys, time
    sys.modules["torch"] = None                      # prove torch is not needed
    import numpy as np
    from torchlax_export import load

    program = load(sys.argv[1])
    print("server: loaded", program, file=sys.stderr)
    requests = np.load(sys.argv[2])
    answers = {}
    for name in requests.files:                      # one request per batch size
        batch = requests[name]
        # The first call of a new batch size compiles the program for it; later calls of that
        # size reuse the compiled program (the steady state a server sees).
        start = time.perf_counter()
        answers[name] = np.asarray(program(batch))
        first = time.perf_counter() - start
        times = []
        for _ in range(5):
            start = time.perf_counter()
            np.asarray(program(batch))
            times.append(time.perf_counter() - start)
        print(f"server: {name} batch={len(batch)}: first call (compiles) {first * 1e3:.1f} ms, "
              f"then {sorted(times)[2] * 1e3:.2f} ms per call (median of 5)", file=sys.stderr)
    np.savez(sys.argv[3], **answers)
    """
)


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    example = torch.randn(4, 1, 28, 28)
    batch = Dim("batch")  # unbounded: any batch size
    artifact = torchlax_export.export(
        model, (example,), dynamic_shapes={"images": {0: batch}}, progress=True
    )
    artifact.save(out)
    print(f"exported to {out}: {artifact}")

    rng = np.random.default_rng(0)
    requests = {f"r{n}": rng.standard_normal((n, 1, 28, 28)).astype(np.float32) for n in (1, 7, 64)}
    np.savez(out / "requests.npz", **requests)
    subprocess.run(
        [
            sys.executable,
            "-c",
            SERVER,
            str(out),
            str(out / "requests.npz"),
            str(out / "answers.npz"),
        ],
        check=True,
    )

    with np.load(out / "answers.npz") as answers, torch.no_grad():
        for name, images in requests.items():
            want = model(torch.from_numpy(images)).numpy()
            err = float(np.abs(answers[name] - want).max())
            print(f"{name}: batch {len(images)}, max |served - PyTorch| = {err:.2e}")
            assert err < 1e-4


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "small_cnn")
