"""``python -m torchlax doctor``, ``python -m torchlax cache [clear]``."""

import sys

from ._doctor import main

sys.exit(main())
