"""What counts as a reward number: the one rule, read wherever a reward is written or read.

A reward is a finite ``int`` or ``float``, returned as a ``float``. Everything else is not a
reward, and in particular:

* ``bool`` is refused although Python calls it an ``int``: ``return ok`` instead of
  ``return 1.0 if ok else 0.0`` is a common slip, and a True that trains as 1.0 hides it;
* NaN and ±inf are refused: one of them in a group turns every advantage of the group into NaN;
* numeric strings (``"0.5"``) are refused: a reward read back from text is a bug upstream;
* an int too large for a float is refused rather than raising ``OverflowError`` from the check.

Callers differ only in what they do with a refusal: the runner and the emitters raise, naming
the value (the agent made a mistake it should hear about); the store, the credit rules and the
dashboard read a refused value as "no reward" (a span written by someone else must not break
them).
"""

from __future__ import annotations

import math
from typing import Any


def reward_number(value: Any) -> float | None:
    """``value`` as a finite float when it is a reward number, else None (see the module doc)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
