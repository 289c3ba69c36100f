"""``torchlax.jit``: a PyTorch function, module or whole training step as one XLA program.

One module per stage of a call (docs/architecture.md draws them in one picture):

- ``_call``: ``jit()`` and the jitted callable; which path a call takes.
- ``_repeated``: the call plans (guard, launch, write-back into the state's objects, all or
  nothing) that run every forward and step; a repeated call (the last plan's guard holds).
- What the step reaches: ``_walk`` (the one object walker, its rules, and the paths errors
  name things by), ``_discover`` (the state it finds), ``_state`` (the layout found, its
  guard, one call's state).
- The program: ``_program`` (trace, vjp, donation), ``_inputs`` (how an argument enters it).
- The capture while it is traced: ``_watch`` (the one observer, the constants it read,
  checked on each call, and the refusals its findings lead to).
- Refusals: ``_refusals`` (the errors, each naming what the step did and what to do).
- The call: ``_autograd`` (autograd across the call), ``_first_call`` (the first call of a
  step that creates state).
- Outputs: ``_outputs``, ``_objects`` (tensors inside returned objects, by the walker).
"""

from ._call import jit as jit
