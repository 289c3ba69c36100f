"""special lowerings."""

from __future__ import annotations
