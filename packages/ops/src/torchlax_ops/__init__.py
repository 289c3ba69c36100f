"""torchlax-ops: lowerings of ATen ops to jax.numpy / jax.lax.

Nothing to call here: the package registers itself as the ``ops`` plugin of torchlax through
its entry point. Each op family lives in ``torchlax_ops._lowerings.<family>``.
"""

from ._explain import explain as explain
from ._promotion import Promotion as Promotion
from ._promotion import elementwise as elementwise
from ._promotion import result_dtypes as result_dtypes

__version__ = "0.1.0"
