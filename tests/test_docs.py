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


def test_the_training_config_reference_is_generated_from_the_docstrings():
    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.config import markdown_reference

    text = (DOCS / "training.md").read_text()
    documented = text.split("<!-- generated: GRPOConfig reference -->\n", 1)[1].split("<!-- end generated -->", 1)[0]
    assert documented == markdown_reference(GRPOConfig), (
        "docs/training.md's reference is stale: paste agentgrad.config.markdown_reference(GRPOConfig) between the markers")
