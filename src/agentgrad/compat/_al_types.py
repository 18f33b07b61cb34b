"""Agent Lightning's data types, as views of AgentGrad's.

An Agent Lightning agent receives ``resources`` as a plain mapping (``NamedResources``) of ``LLM`` /
``PromptTemplate`` items, and an ``AttemptedRollout`` that carries its ``attempt``. AgentGrad's
runner hands over its own :class:`~agentgrad.types.Resources` and :class:`~agentgrad.types.Rollout`;
:func:`named_resources` and :func:`attempted_rollout` turn them into these views. The classes
subclass AgentGrad's, so they are stored, validated and published exactly like them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import model_validator

from agentgrad import types as ag
from agentgrad.errors import AgentGradError

T = TypeVar("T")


class UnsupportedError(AgentGradError, NotImplementedError):
    """An Agent Lightning name or setting that AgentGrad does not support; the message says what
    to use instead."""


#: Agent Lightning's ``Dataset[T]``: any sequence of tasks (a list, a Hugging Face dataset's rows).
Dataset = list
Attempt = ag.Attempt
RolloutConfig = ag.RolloutConfig


class LLM(ag.LLM):
    """``agentlightning.LLM``: AgentGrad's :class:`~agentgrad.types.LLM` plus ``get_base_url``.

    ``sampling_parameters`` is AgentGrad's ``sampling`` (one dictionary, two names).
    """

    def get_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        """The endpoint to call. AgentGrad's runner already points it at the capture proxy's URL
        for the running rollout and attempt, so the ids are only checked, as Agent Lightning's
        ``ProxyLLM`` checks them (both or neither)."""
        if (rollout_id is None) != (attempt_id is None):
            raise ValueError("get_base_url() takes both rollout_id and attempt_id, or neither")
        return self.endpoint


class PromptTemplate(ag.PromptTemplate):
    """``agentlightning.PromptTemplate``: ``engine`` is ``f-string`` or ``jinja`` (both formatted
    by ``format()``); ``poml`` is refused, naming what to use instead."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_poml(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("engine") == "poml":
            raise UnsupportedError(
                "PromptTemplate(engine='poml') is not supported by AgentGrad: write the template "
                "as engine='f-string' or engine='jinja'"
            )
        return data


class NamedResources(dict[str, Any]):
    """``agentlightning.NamedResources``: a plain ``dict`` of resource name → ``LLM`` /
    ``PromptTemplate`` (other JSON values as they were published). ``resources_id`` and ``version``
    say which AgentGrad snapshot it came from."""

    resources_id: str | None = None
    version: int | None = None


class Rollout(ag.Rollout):
    """``agentlightning.Rollout`` as an agent receives it (Agent Lightning's ``AttemptedRollout``):
    AgentGrad's rollout with the running ``attempt``."""

    attempt: ag.Attempt


AttemptedRollout = Rollout
RolloutMode = Literal["train", "val", "test"]


def _view(item: Any) -> Any:
    if isinstance(item, ag.LLM) and not isinstance(item, LLM):
        return LLM.model_construct(**dict(item))
    if isinstance(item, ag.PromptTemplate) and not isinstance(item, PromptTemplate):
        return PromptTemplate.model_construct(**dict(item))
    if isinstance(item, ag.JsonResource):
        return item.value
    return item


def named_resources(resources: ag.Resources | Mapping[str, Any]) -> NamedResources:
    """AgentGrad resources as the mapping an Agent Lightning agent reads."""
    if isinstance(resources, ag.Resources):
        named = NamedResources({name: _view(item) for name, item in resources.items.items()})
        named.resources_id, named.version = resources.resources_id, resources.version
        return named
    return NamedResources({name: _view(item) for name, item in resources.items()})


def attempted_rollout(rollout: ag.Rollout, attempt: ag.Attempt) -> Rollout:
    """The rollout with its running attempt (no re-validation: both were validated by the store)."""
    return Rollout.model_construct(**dict(rollout), attempt=attempt)
