"""The golden test of tiny_grpo: ``tinygrpo`` importable, as ``train.py`` makes it."""

from __future__ import annotations

import sys
from pathlib import Path

JOB = Path(__file__).resolve().parents[1]
if str(JOB) not in sys.path:
    sys.path.insert(0, str(JOB))
