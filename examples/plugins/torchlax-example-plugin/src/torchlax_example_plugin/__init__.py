"""An example torchlax plugin package (the plugin module itself is ``.plugin``)."""

from .ops import scaled_swish as scaled_swish
from .plugin import place_on as place_on

__version__ = "0.1.0"
