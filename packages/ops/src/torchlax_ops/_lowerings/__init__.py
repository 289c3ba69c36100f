"""Every op family's lowerings; importing this package fills ``_table``."""

from . import elementwise  # noqa: F401
