"""Tensors on two different jax devices in one op raise DeviceMismatchError, as PyTorch does.

JAX gets a second (host) device only from XLA_FLAGS set before it starts, so the cases run in
a subprocess.
"""

import os
import subprocess
import sys

_TWO_DEVICES = """
import torch, torchlax
from torchlax_core import DeviceMismatchError
with torchlax.enable():
    a = torch.ones(3, device="jax:0")
    b = torch.ones(3, device="jax:1")
    for name, op in (("add", lambda: a + b), ("mm", lambda: torch.mm(a.view(3, 1), b.view(1, 3))),
                     ("cat", lambda: torch.cat([a, b]))):
        try:
            op()
            print(name, "no error")
        except DeviceMismatchError as exc:
            print(name, exc)
    same = b + a.to("jax:1")
    print("same device", same.device, same.cpu().tolist())
"""


def test_two_jax_devices_in_one_op_raise():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "add aten.add.Tensor got tensors on different devices: jax:0 as argument 'self' and "
        "jax:1 as argument 'other'. Expected all tensors to be on the same device: move one "
        "first, e.g. with tensor.to(other.device)."
    )
    assert lines[1].startswith(
        "mm aten.mm.default got tensors on different devices: jax:0 as "
        "argument 'self' and jax:1 as argument 'mat2'."
    )
    assert lines[2].startswith("cat aten.cat.default got tensors on different devices: jax:0")
    assert lines[3] == "same device jax:1 [2.0, 2.0, 2.0]"
