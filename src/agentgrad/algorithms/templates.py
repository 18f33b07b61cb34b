"""Checking prompt templates before they are published.

A template that names a variable the agent never supplies fails only later, inside a runner, on
every rollout — and an optimizer would score it 0 and learn nothing. Checking the variables when
a template is *published* turns that into one clear error naming the missing variables.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from agentgrad.errors import InvalidInputError
from agentgrad.types import PromptTemplate

_ROOT_NAME = re.compile(r"^[^.\[]*")


class TemplateError(InvalidInputError):
    """A template that cannot be used: a syntax error, or variables nobody supplies.

    ``missing`` holds variables the template reads but nobody supplies; ``dropped`` holds required
    variables it no longer reads (both empty for syntax errors).
    """

    def __init__(self, message: str, missing: Iterable[str] = (), dropped: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.missing = sorted(missing)
        self.dropped = sorted(dropped)


def template_variables(template: PromptTemplate) -> set[str]:
    """The top-level variable names a template reads (``{task.question}`` → ``task``).

    Raises :class:`TemplateError` when the template does not parse under its engine, or (f-string)
    uses positional fields, which no keyword-only ``format(**variables)`` call can fill.
    """
    if template.engine == "jinja":
        import jinja2  # lazy: only Jinja templates need it
        from jinja2 import meta

        try:
            return set(meta.find_undeclared_variables(jinja2.Environment().parse(template.template)))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"Jinja template does not parse: {exc.message} (line {exc.lineno})") from None
    names: set[str] = set()
    try:
        fields = list(string.Formatter().parse(template.template))
    except ValueError as exc:
        raise TemplateError(f"f-string template does not parse: {exc} (write literal braces as {{{{ }}}})") from None
    for _, field_name, _, _ in fields:
        if field_name is None:
            continue
        root = _ROOT_NAME.match(field_name).group(0)  # type: ignore[union-attr]
        if not root or root.isdigit():
            raise TemplateError(f"f-string template has a positional field {{{field_name}}}; name every "
                                "variable (e.g. {question})")
        names.add(root)
    return names


def validate_template(template: PromptTemplate, variables: Iterable[str],
                      required: Iterable[str] = ()) -> set[str]:
    """Refuse a template that reads a variable outside ``variables`` or drops a ``required`` one.

    Returns the variables the template reads. The error message names every offending variable,
    so a user (or an APO log line) can see at once why a template was refused.
    """
    used = template_variables(template)
    allowed = set(variables)
    missing = used - allowed
    if missing:
        raise TemplateError(
            f"template references variable(s) {sorted(missing)} that the agent does not supply "
            f"(available: {sorted(allowed)})", missing)
    dropped = set(required) - used
    if dropped:
        raise TemplateError(f"template no longer uses required variable(s) {sorted(dropped)}", dropped=dropped)
    return used
