"""``python -m torchlax doctor``."""

import sys

from ._doctor import main

sys.exit(main())
