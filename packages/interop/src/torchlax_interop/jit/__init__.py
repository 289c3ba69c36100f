"""``torchlax.jit``: a PyTorch function, module or whole training step as one XLA program.

One module per stage of a call (docs/architecture.md draws them in one picture):

- ``_call``: ``jit()`` and the jitted callable; which path a call takes.
- ``_repeated``: a call that repeats the last one (the last plan's guard still holds).
- What the step reaches: ``_walk`` (the one object walker and its rules), ``_discover``
  (the state it finds), ``_state`` (the layout found, its guard, one call's state).
- The program: ``_program`` (trace, vjp, donation), ``_inputs`` (how an argument enters it).
- The capture while it is traced: ``_watch`` (the one observer, and the constants it read,
  checked on each call).
- Refusals: ``_refusals`` (the errors) and ``_paths`` (how the function reaches what they name,
  by the walker).
- The call: ``_write_back`` and ``_commit`` (the launch and write-back, all or nothing),
  ``_autograd`` (autograd across the call).
- Outputs: ``_outputs``, ``_objects`` (tensors inside returned objects, by the walker).
"""

from ._call import jit as jit
