"""Checking prompt templates before they are published.

A template that names a variable the agent never supplies fails only later, inside a runner, on
every rollout — and an optimizer would score it 0 and learn nothing. Checking the variables when
a template is *published* turns that into one clear error naming the missing variables.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentgrad.errors import TemplateError
from agentgrad.types import PromptTemplate

__all__ = ["TemplateError", "validate_template"]


def validate_template(template: PromptTemplate, variables: Iterable[str], required: Iterable[str] = ()) -> set[str]:
    """Refuse a template that reads a variable outside ``variables`` or drops a ``required`` one.

    Returns the variables the template reads. The error message names every offending variable,
    so a user (or an APO log line) can see at once why a template was refused.
    """
    used = template.referenced_variables()
    allowed = set(variables)
    missing = used - allowed
    if missing:
        raise TemplateError(
            f"template references variable(s) {sorted(missing)} that the agent does not supply "
            f"(available: {sorted(allowed)})",
            missing,
        )
    dropped = set(required) - used
    if dropped:
        raise TemplateError(f"template no longer uses required variable(s) {sorted(dropped)}", dropped=dropped)
    return used
