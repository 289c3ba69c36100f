"""Sharded checkpoints of a model and its optimizer through orbax-checkpoint.

``Checkpointer(directory)`` saves and restores the state that
``torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)`` names (parameter
and buffer FQNs; optimizer state keyed by parameter FQN), so a checkpoint holds the same names
as one written with ``torch.distributed.checkpoint``. Arrays go to orbax as the ``jax.Array``
each torchlax Tensor holds: every process writes only the shards it holds, in the background
(orbax's asynchronous save), and a restore reads each array straight into the sharding of the
tensor it restores into. Everything that is no tensor (``param_groups``' hyperparameters)
is kept as JSON beside the arrays.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.core
import numpy as np
import torch
from torchlax_core import Tensor, TorchlaxError, torch_dtype
from torchlax_core.internal import array_of, from_torch_data, write, x64


class CheckpointError(TorchlaxError, RuntimeError):
    """A checkpoint cannot be written or read back into the given model and optimizer."""


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise CheckpointError(
            "torchlax.distributed.Checkpointer writes checkpoints with orbax-checkpoint, which "
            "is not installed. Install it with `pip install 'torchlax[checkpoint]'` (or "
            "`pip install orbax-checkpoint`), or save with torch.distributed.checkpoint."
        ) from None
    return ocp


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    # torch's own naming, so DCP and orbax checkpoints name the same tensors alike; for an
    # optimizer without state yet, get_state_dict creates it (a step with zero gradients).
    from torch.distributed.checkpoint import state_dict as dcp_state

    if optimizer is None:
        return dcp_state.get_model_state_dict(model), None
    return dcp_state.get_state_dict(model, optimizer)


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    # numpy keeps bfloat16/float8 through ml_dtypes; from_torch_data knows torch's dtypes
    return np.asarray(jax.device_get(from_torch_data(tensor.detach())))


def _leaf(tensor: torch.Tensor, where: str):
    if isinstance(tensor, Tensor):
        array = array_of(tensor)
        if isinstance(array, jax.core.Tracer):
            raise CheckpointError(
                f"Checkpointer.save: {where} is being traced (save was called inside a jitted "
                "function); save between steps, outside torchlax.jit and jax.jit."
            )
        return array
    return _host_array(tensor)


_ARRAY = {"__array__": True}  # where the JSON part of a checkpoint has a tensor


def _split(value: Any, where: str) -> tuple[Any, Any]:
    """``value`` as (JSON with each tensor marked, the tensors' arrays as a nested dict).

    The arrays keep the state's own names as their paths (``model`` / FQN, ``optim`` /
    ``state`` / FQN / ``exp_avg``), so the checkpoint names them as DCP does.
    """
    if isinstance(value, torch.Tensor):
        return _ARRAY, _leaf(value, where)
    if isinstance(value, Mapping | list | tuple):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        layout, arrays = {}, {}
        for key, item in items:
            layout[str(key)], array = _split(item, f"{where}[{key!r}]")
            if array is not None:
                arrays[str(key)] = array
        if not isinstance(value, Mapping):
            layout = list(layout.values())
        return layout, (arrays or None)
    if value is None or isinstance(value, bool | int | float | str):
        return value, None
    raise CheckpointError(
        f"Checkpointer.save: {where} is a {type(value).__name__}, which a checkpoint cannot "
        "hold; only tensors, numbers, strings, None and lists/dicts of them are saved."
    )


def _state(model, optimizer) -> dict:
    model_sd, optim_sd = _state_dicts(model, optimizer)
    state: dict[str, Any] = {"model": model_sd}
    if optim_sd is not None:
        state["optim"] = optim_sd
    return state


class Checkpointer:
    """Save and restore ``model`` (and ``optimizer``) as sharded checkpoints, step by step.

    ``directory`` holds one checkpoint per step (orbax's ``CheckpointManager``);
    ``max_to_keep`` keeps the newest ones only (None: all). ``save`` returns once the arrays
    are copied off the devices and writes the files in the background (``async_save=False``:
    before it returns); ``wait()`` waits for the writes. In a multi-process run (after
    ``jax.distributed.initialize``) every process calls ``save`` and ``restore`` with the same
    step, and each reads and writes only its own shards.
    """

    def __init__(
        self, directory: str | os.PathLike, *, max_to_keep: int | None = None, async_save=True
    ):
        ocp = _orbax()
        self._ocp = ocp
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Start writing ``model``'s (and ``optimizer``'s) state as checkpoint ``step``.

        The arrays saved are the ones the tensors hold now: training may go on at once (JAX
        arrays are immutable; a step replaces them). Returns whether a checkpoint was started.
        """
        layout, arrays = _split(_state(model, optimizer), "the state")
        ocp = self._ocp
        args = ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays), layout=ocp.args.JsonSave(layout)
        )
        with x64():  # as torchlax holds them: int64/float64 not narrowed on the way
            return bool(self._manager.save(int(step), args=args, force=force))

    def restore(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        step: int | None = None,
    ) -> int:
        """Load checkpoint ``step`` (None: the newest) into ``model`` and ``optimizer``, in
        place; returns the step.

        Each tensor keeps its layout: its array is read straight into the sharding the tensor
        has now (lay the model out with ``shard`` or ``materialize`` first). Parameters keep
        their identity, so an optimizer built before still updates them.
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(
                    f"Checkpointer.restore: {self.directory} holds no checkpoint yet; save one "
                    "first, or check the directory."
                )
        ocp = self._ocp
        live = _state(model, optimizer)  # (a fresh optimizer's state is laid out like its params)
        live_layout, live_arrays = _split(live, "the state")
        saved_layout = self._manager.restore(
            step, args=ocp.args.Composite(layout=ocp.args.JsonRestore())
        )["layout"]
        _check_same_layout(saved_layout, live_layout, "the state")
        targets = jax.tree.map(_abstract, live_arrays)
        with x64():
            restored = self._manager.restore(
                step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(targets))
            )["arrays"]
        _merge(live, saved_layout, restored, "the state")
        self._load(model, optimizer, live)
        return int(step)

    @staticmethod
    def _load(model, optimizer, state: dict) -> None:
        from torch.distributed.checkpoint import state_dict as dcp_state

        if optimizer is None:
            dcp_state.set_model_state_dict(model, state["model"])
            return
        dcp_state.set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )

    def latest_step(self) -> int | None:
        """The newest step saved in ``directory`` (None: none yet)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The steps saved in ``directory``, oldest first."""
        return sorted(self._manager.all_steps())

    def wait(self) -> None:
        """Wait until every checkpoint started is written."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for the writes, then release orbax's resources."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _abstract(array):
    if isinstance(array, jax.Array):
        bits = 8 * array.dtype.itemsize // (2 if array.dtype.kind == "c" else 1)
        if not array.committed or bits == 64:
            # Restored on the host, then put where the tensor is (_write_tensor): uncommitted
            # as it was, or a 64-bit array, which orbax's reading threads would narrow to 32
            # bits (they do not see torchlax's 64-bit mode)
            return np.empty(array.shape, array.dtype)
        return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding)
    return array  # a host (numpy) array is restored as one


def _check_same_layout(saved: Any, live: Any, where: str) -> None:
    """Both states hold tensors under the same names (values of other leaves may differ)."""
    if live == _ARRAY:
        if saved != _ARRAY:
            raise CheckpointError(
                f"Checkpointer.restore: {where} is a tensor in the model/optimizer but not in "
                "the checkpoint; restore into the same kind of model and optimizer it was "
                "saved from."
            )
        return
    if isinstance(live, dict) and isinstance(saved, dict):
        missing, extra = sorted(live.keys() - saved.keys()), sorted(saved.keys() - live.keys())
        if missing or extra:
            raise CheckpointError(
                f"Checkpointer.restore: the checkpoint's {where} does not match the model and "
                f"optimizer given: missing from the checkpoint {missing[:5]}, not in the model "
                f"or optimizer {extra[:5]}. Restore into the model and optimizer it was saved "
                "from (same module names, same parameters given to the optimizer)."
            )
        for key in live:
            _check_same_layout(saved[key], live[key], f"{where}[{key!r}]")
    elif isinstance(live, list) and isinstance(saved, list) and len(live) == len(saved):
        for i, (s, v) in enumerate(zip(saved, live)):
            _check_same_layout(s, v, f"{where}[{i}]")
    elif isinstance(live, list) and isinstance(saved, list):
        raise CheckpointError(
            f"Checkpointer.restore: {where} has {len(saved)} entries in the checkpoint but "
            f"{len(live)} in the model/optimizer given; restore into the same kind of model "
            "and optimizer (same parameter groups) it was saved from."
        )


def _merge(live: Any, saved: Any, restored: Any, where: str) -> Any:
    """``live`` with the checkpoint's values: tensors written in place, other leaves replaced."""
    if isinstance(live, torch.Tensor):
        _write_tensor(live, restored, where)
        return live
    if isinstance(live, dict):
        for key in live:
            below = restored.get(str(key)) if restored is not None else None
            live[key] = _merge(live[key], saved[str(key)], below, f"{where}[{key!r}]")
        return live
    if isinstance(live, list | tuple):
        return type(live)(
            _merge(v, s, None if restored is None else restored.get(str(i)), f"{where}[{i}]")
            for i, (v, s) in enumerate(zip(live, saved))
        )
    return saved


def _write_tensor(tensor: torch.Tensor, array, where: str) -> None:
    if tuple(array.shape) != tuple(tensor.shape):
        raise CheckpointError(
            f"Checkpointer.restore: {where} has shape {tuple(array.shape)} in the checkpoint but "
            f"{tuple(tensor.shape)} in the model/optimizer given; restore into a model built "
            "with the same configuration."
        )
    with torch.no_grad():
        if isinstance(tensor, Tensor):
            if not isinstance(array, jax.Array):  # read on the host (see _abstract)
                live = array_of(tensor)
                where_to = live.sharding if live.committed else None
                array = from_torch_data(_torch_from_host(np.asarray(array)), where_to)
            dtype = array_of(tensor).dtype
            if array.dtype != dtype:  # as load_state_dict's copy_: cast to the tensor's dtype
                with x64():
                    array = array.astype(dtype)
            write(tensor, array)
        else:
            tensor.copy_(_torch_from_host(np.asarray(array)))


def _torch_from_host(array: np.ndarray) -> torch.Tensor:
    if array.dtype.type.__module__ == "numpy":
        return torch.from_numpy(np.array(array, copy=True))
    # bfloat16/float8 (ml_dtypes): numpy has no native type; move the bytes
    raw = np.array(array, copy=True).view(np.uint8 if array.dtype.itemsize == 1 else np.int16)
    return torch.from_numpy(raw).view(torch_dtype(array.dtype))
