"""``torchlax.jit``: a PyTorch function, module or whole training step as one XLA program.

The stages of a call, each a module (docs/architecture.md draws them in one picture):

- ``_call``: ``jit()`` and the jitted callable; which path a call takes.
- ``_state`` and its helpers ``_holders`` (which plain objects are entered) and ``_paths`` (how
  the function reaches an object, to name it in an error): the state a step reaches, found by
  one walk and re-checked cheaply on each call.
- ``_watch``, ``_constants``, ``_cpu_tensors``, ``_constant_modules``: what the step does while
  it is traced that the program would not redo (the capture).
- ``_refusals``: the errors that name what the step did.
- ``_objects``: tensors inside returned objects.
- ``_commit``: the launch and write-back, all or nothing.
"""

from ._call import jit as jit
