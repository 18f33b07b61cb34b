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


@pytest.mark.parametrize("name", ["GRPOConfig", "SFTConfig"])
def test_the_training_config_references_are_generated_from_the_docstrings(name: str) -> None:
    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.algorithms.sft import SFTConfig
    from agentgrad.config import markdown_reference

    cls = {"GRPOConfig": GRPOConfig, "SFTConfig": SFTConfig}[name]
    text = (DOCS / "training.md").read_text()
    documented = text.split(f"<!-- generated: {name} reference -->\n", 1)[1].split("<!-- end generated -->", 1)[0]
    assert documented == markdown_reference(cls), (
        f"docs/training.md's reference is stale: paste agentgrad.config.markdown_reference({name}) between the markers"
    )
