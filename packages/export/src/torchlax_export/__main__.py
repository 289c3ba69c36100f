"""``python -m torchlax_export``: see ``_cli``."""

from ._cli import main

raise SystemExit(main())
