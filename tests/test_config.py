"""field_docs: a settings field's help, read from its attribute docstring (or ``#:`` comment)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from agentgrad.config import field_docs


@dataclass
class Base:
    a: int = 1
    """The first field.

    Two paragraphs, dedented."""
    b: str = "x"
    #: A comment above the field,
    #: over two lines.
    c: float = 0.0


@dataclass
class Child(Base):
    b: str = "y"
    """Redefined here, with its own help."""
    d: bool = False
    """A field of the subclass."""
    #: not a field's comment: a method follows

    def method(self) -> int:
        """Not a field."""
        return self.a


def test_docstrings_comments_and_missing_help_in_definition_order():
    assert field_docs(Base) == {
        "a": "The first field.\n\nTwo paragraphs, dedented.",
        "b": "",
        "c": "A comment above the field, over two lines.",
    }


def test_a_subclass_inherits_and_overrides_help():
    docs = field_docs(Child)
    assert docs == {
        "a": "The first field.\n\nTwo paragraphs, dedented.",
        "b": "Redefined here, with its own help.",
        "c": "A comment above the field, over two lines.",
        "d": "A field of the subclass.",
    }
    assert list(docs) == [f.name for f in fields(Child)]


def test_a_class_without_source_is_a_type_error():
    made = type("Made", (), {"__annotations__": {"x": int}})
    with pytest.raises(TypeError, match="cannot read the source of Made"):
        field_docs(made)
