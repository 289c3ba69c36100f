"""Reading a model that another thread trains under ``torchlax.jit`` (an evaluation or
checkpointing thread) sees the state before or after a step, never an error (#37, item 5):
neither the tracers of a trace nor the arrays donated to a running step."""

import threading

import torch
import torch.nn.functional as F
import torchlax
from torch import nn


def test_a_reader_thread_sees_whole_steps_and_no_errors():
    torch.manual_seed(0)
    with torchlax.enable():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        shapes = [(8, 16, 4), (4, 16, 4)]  # a second signature: the step is traced again
        data = [
            (torch.randn(n, i, device="jax"), torch.randn(n, o, device="jax")) for n, i, o in shapes
        ]

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    jstep = torchlax.jit(step)
    errors: list = []
    reads = [0]
    done = threading.Event()

    def reader():
        with torchlax.enable():
            while not done.is_set():
                try:
                    with torch.no_grad():
                        for p in model.parameters():
                            assert torch.isfinite(p.sum()).item()
                            (p * 2).clone()
                        {k: v.cpu() for k, v in model.state_dict().items()}
                    reads[0] += 1
                except Exception as exc:  # noqa: BLE001  (collected: the test asserts none)
                    errors.append(repr(exc))

    readers = [threading.Thread(target=reader) for _ in range(1)]
    for t in readers:
        t.start()
    try:
        for i in range(30):
            jstep(*data[(i // 10) % 2])
            if i % 10 == 5:
                jstep._last.plan = None  # pyright: ignore[reportFunctionMemberAccess]  (the general path too)
    finally:
        done.set()
        for t in readers:
            t.join()
    assert errors == []
    assert reads[0] > 0
