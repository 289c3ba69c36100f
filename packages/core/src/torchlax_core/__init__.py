"""torchlax-core: the torch.Tensor subclass over jax.Array, the environment and the registry.

Install ``torchlax-ops`` for the op lowerings, or ``torchlax`` for everything.

What torchlax's own packages use beyond this API is in ``torchlax_core.internal`` (no stability
promise to third parties).
"""

from . import (
    _capturable_adam,
    _compilation_cache,  # noqa: F401  (it turns the cache on when imported, before any compile)
    _fast_methods,
    _logging,
    _privateuse1,
)
from . import hookspecs as hookspecs
from ._checks import check as check
from ._checks import check_index as check_index
from ._checks import check_sizes as check_sizes
from ._checks import checked as checked
from ._checks import raise_error as raise_error
from ._compilation_cache import clear_compilation_cache as clear_compilation_cache
from ._compilation_cache import compilation_cache_dir as compilation_cache_dir
from ._dtypes import jax_dtype as jax_dtype
from ._dtypes import torch_dtype as torch_dtype
from ._environment import Config as Config
from ._environment import Environment as Environment
from ._environment import current_env as current_env
from ._environment import default_env as default_env
from ._environment import disable_globally as disable_globally
from ._environment import enable as enable
from ._environment import enable_globally as enable_globally
from ._environment import is_enabled as is_enabled
from ._errors import DeviceMismatchError as DeviceMismatchError
from ._errors import DtypeNotImplementedError as DtypeNotImplementedError
from ._errors import JitArgumentError as JitArgumentError
from ._errors import JitError as JitError
from ._errors import OpNotLoweredError as OpNotLoweredError
from ._errors import PluginConflictError as PluginConflictError
from ._errors import PluginError as PluginError
from ._errors import ProgramFailedError as ProgramFailedError
from ._errors import ProgramOutOfMemoryError as ProgramOutOfMemoryError
from ._errors import TorchlaxError as TorchlaxError
from ._errors import UnsupportedDtypeError as UnsupportedDtypeError
from ._logging import logger as logger
from ._registry import Lowering as Lowering
from ._registry import PluginRecord as PluginRecord
from ._registry import Registration as Registration
from ._tensor import Tensor as Tensor
from ._wrap import unwrap as unwrap
from ._wrap import wrap as wrap
from .hookspecs import hookimpl as hookimpl

__version__ = "0.1.0"

_privateuse1.set_up()
_fast_methods.install()  # the Tensor's hot operators, served before PyTorch's dispatcher
_logging.configure_from_env()
_capturable_adam.install()  # the jax device's capturable Adam without 0/0 (lr 0)
