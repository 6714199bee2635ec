"""The chaos tests reuse the integration tests' helpers (``test_cli``'s CLI-started head)."""

from __future__ import annotations

import sys
from pathlib import Path

INTEGRATION_DIR = str(Path(__file__).parent.parent / "integration")
if INTEGRATION_DIR not in sys.path:
    sys.path.append(INTEGRATION_DIR)
