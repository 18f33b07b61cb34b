"""Make ``examples`` importable (the SFT tests run the real calculator agent from examples/calc)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
