"""Prompt templates are checked when published, so a bad one fails once, naming the variables."""

import pytest
from pydantic import ValidationError

from agentgrad.store.memory import MemoryStore
from agentgrad.types import PromptTemplate


@pytest.mark.parametrize(
    "engine,text", [("f-string", "Solve {question} using {hint}"), ("jinja", "Solve {{ question }} using {{ hint }}")]
)
def test_publishing_a_template_with_unsupplied_variables_is_refused(engine: str, text: str) -> None:
    store = MemoryStore(watchdog_interval=None)
    good = store.add_resources({"prompt": PromptTemplate(template="Solve {question}", variables=["question"])})
    with pytest.raises(ValidationError, match=r"\['hint'\].*available: \['question'\]"):
        store.add_resources(
            {
                "prompt": {
                    "resource_type": "prompt_template",
                    "template": text,
                    "engine": engine,
                    "variables": ["question"],
                }
            }
        )
    assert [r.resources_id for r in store.query_resources()] == [good.resources_id]


def test_templates_without_declared_variables_are_not_checked() -> None:
    template = PromptTemplate(template="Solve {question} using {hint}")
    assert template.referenced_variables() == {"question", "hint"}
    assert template.format(question="1+1", hint="add") == "Solve 1+1 using add"
