"""The golden test of the TRL example: ``train`` (the example's training script) importable."""

from __future__ import annotations

import sys
from pathlib import Path

JOB = Path(__file__).resolve().parents[1]
if str(JOB) not in sys.path:
    sys.path.insert(0, str(JOB))
