"""The span reference (docs/reference/spans.md) lists every constant of agentgrad.semconv."""

from pathlib import Path

import pytest

from agentgrad import semconv

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONSTANTS = sorted(name for name in vars(semconv) if name.isupper())


@pytest.mark.parametrize("page", ["reference/spans.md", "concepts.md"])
def test_every_semconv_constant_is_documented(page):
    text = (DOCS / page).read_text()
    missing = [name for name in CONSTANTS if f"| `{name}` | `{getattr(semconv, name)}` |" not in text]
    assert not missing, f"{page} lacks rows for {missing}"
