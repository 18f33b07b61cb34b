"""The data model every component shares (explained in docs/concepts.md).

Everything that crosses a process boundary — through the store, the HTTP service or a runner
pool — is one of these pydantic models, so validation happens once, at the edge, and the rest
of the code can trust its inputs.
"""

from __future__ import annotations

import enum
import os
import random
import re
import string
import time
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StringConstraints,
    field_validator,
    model_validator,
)

from agentgrad.errors import TemplateError


def now() -> float:
    """Wall-clock seconds since the epoch; the one clock every record uses."""
    return time.time()


def new_id(prefix: str) -> str:
    """A short, unique, sortable-enough identifier such as ``ro-1f3a…``: 64 random bits from
    the OS (a third of the cost of a whole ``uuid4``, whose version bits would be wasted here)."""
    return f"{prefix}-{os.urandom(8).hex()}"


#: Span and trace ids come from ``random``, as OpenTelemetry's SDK makes them: a span id is drawn
#: for every span an agent writes, and the generator (seeded from the OS, reseeded in forked
#: children) is several times cheaper than ``uuid4``. Ids need uniqueness, not secrecy.
_random_bits = random.getrandbits


#: The largest integer any stored or queried field may hold: a signed 64-bit integer, the widest
#: column SQLite and PostgreSQL have. Larger numbers are refused at the edge (422), not left to
#: overflow inside a backend.
INT64_MAX = 2**63 - 1
#: The largest step of a metric record: its column is PostgreSQL's (32-bit) INTEGER.
MAX_STEP = 2**31 - 1
#: The longest id (rollout, attempt, span, resources, worker, run) in characters: ids are keys of
#: database indexes, and PostgreSQL refuses an index entry over 2,704 bytes.
MAX_ID_LENGTH = 256
_NO_NUL = r"^[^\x00]*$"
#: An id that is also a database key. No NUL character: PostgreSQL text cannot hold one, and
#: every backend refuses what one of them cannot store, so they agree.
Key = Annotated[str, StringConstraints(max_length=MAX_ID_LENGTH, pattern=_NO_NUL)]
#: A name stored in a column of its own (a span's name, a metric run): no NUL character.
Name = Annotated[str, StringConstraints(pattern=_NO_NUL)]
#: A count, step or position stored as a database integer: 0 … INT64_MAX.
StoredInt = Annotated[int, Field(ge=0, le=INT64_MAX)]


class RolloutStatus(str, enum.Enum):
    QUEUING = "queuing"
    PREPARING = "preparing"
    RUNNING = "running"
    REQUEUING = "requeuing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    # The status properties compare identities with module constants: the store asks them on
    # every call, and enum class lookups and enum hashing are slow Python code.
    @property
    def is_terminal(self) -> bool:
        return self is _SUCCEEDED or self is _FAILED or self is _CANCELLED

    @property
    def is_queued(self) -> bool:
        return self is _QUEUING or self is _REQUEUING


_QUEUING, _REQUEUING = RolloutStatus.QUEUING, RolloutStatus.REQUEUING
_SUCCEEDED, _FAILED, _CANCELLED = RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED


class AttemptStatus(str, enum.Enum):
    PREPARING = "preparing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    UNRESPONSIVE = "unresponsive"

    @property
    def is_terminal(self) -> bool:
        return self is not _PREPARING and self is not _RUNNING  # identities, as in RolloutStatus


_PREPARING, _RUNNING = AttemptStatus.PREPARING, AttemptStatus.RUNNING


RetryReason = Literal["failed", "timeout", "unresponsive"]
RolloutMode = Literal["train", "val", "test"]


#: Every reason an attempt can be retried for.
ALL_RETRY_REASONS: tuple[RetryReason, ...] = ("failed", "timeout", "unresponsive")
#: The runner's default ``heartbeat_interval`` (seconds); a runner beats this often per attempt.
HEARTBEAT_INTERVAL_SECONDS = 5.0
#: The default heartbeat deadline: six missed heartbeats. Long enough for a busy runner, a slow
#: store call and a store restart (the watchdog counts silence from the store's own start);
#: short enough that a killed runner's rollout runs again within a minute.
UNRESPONSIVE_SECONDS = 6 * HEARTBEAT_INTERVAL_SECONDS


class RolloutConfig(BaseModel):
    """How long an attempt may take and when a failed attempt is retried.

    ``max_attempts`` counts every attempt, the first included: 1 means no retries.

    The defaults recover a rollout whose runner died (killed, out of memory, its machine lost)
    and nothing else: its attempt is ended ``unresponsive`` after ``unresponsive_seconds`` (30 s)
    without a heartbeat, and the rollout runs again, up to 3 attempts. An agent's own failure is
    not retried unless asked: ``retry_on`` defaults to ``["unresponsive"]`` when ``max_attempts``
    is left at its default, and to all three reasons when ``max_attempts`` is given (so
    ``RolloutConfig(max_attempts=2)`` retries a failure once, as it always has). Set
    ``unresponsive_seconds=None`` to wait for a silent attempt forever.
    """

    model_config = ConfigDict(extra="forbid")

    #: Longest an attempt may run before the watchdog ends it ``timeout`` (None: no limit).
    timeout_seconds: FiniteFloat | None = Field(default=None, gt=0)
    #: Longest an attempt may go without a heartbeat (or span) before the watchdog ends it
    #: ``unresponsive`` (None: never).
    unresponsive_seconds: FiniteFloat | None = Field(default=UNRESPONSIVE_SECONDS, gt=0)
    #: Attempts per rollout, the first included.
    max_attempts: int = Field(default=3, ge=1, le=INT64_MAX)
    #: Which endings of an attempt are retried (see the class doc for the default).
    retry_on: list[RetryReason] = Field(default_factory=lambda: cast(list[RetryReason], ["unresponsive"]))

    @model_validator(mode="before")
    @classmethod
    def _retry_on_default(cls, data: Any) -> Any:
        """Who sets ``max_attempts`` asks for retries of every kind, as before these defaults."""
        if isinstance(data, dict) and "max_attempts" in data and "retry_on" not in data:
            data = {**data, "retry_on": list(ALL_RETRY_REASONS)}
        return data


class Rollout(BaseModel):
    """One task to run, possibly over several attempts."""

    rollout_id: str
    input: Any = None
    mode: RolloutMode = "train"
    resources_id: str | None = None
    status: RolloutStatus = RolloutStatus.QUEUING
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    enqueue_time: float = Field(default_factory=now)
    start_time: float | None = None
    end_time: float | None = None
    #: Number of attempts made so far (the latest attempt's ``sequence_id``).
    num_attempts: int = 0
    #: Final reward, filled by the runner from the agent's return value or emitted rewards.
    reward: float | None = None
    #: Number of captured LLM calls; 0 on a finished rollout means no training data.
    llm_calls: int = 0
    #: The agent names of those calls, in the order first seen (what ``agent_match`` selects from).
    agent_names: list[str] = Field(default_factory=list)

    @property
    def group_id(self) -> str | None:
        return self.metadata.get("group_id")


class AttemptError(BaseModel):
    type: str
    message: str
    traceback: str | None = None


class Attempt(BaseModel):
    rollout_id: str
    attempt_id: str
    sequence_id: int
    worker_id: str | None = None
    status: AttemptStatus = AttemptStatus.PREPARING
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    last_heartbeat_time: float | None = None
    error: AttemptError | None = None


class AttemptedRollout(BaseModel):
    """What a runner receives from ``dequeue``: the rollout and the attempt it must run."""

    rollout: Rollout
    attempt: Attempt


class SpanStatus(BaseModel):
    status_code: Literal["UNSET", "OK", "ERROR"] = "UNSET"
    description: str | None = None


class SpanEvent(BaseModel):
    name: str
    timestamp: float | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)


class Span(BaseModel):
    """An OpenTelemetry-shaped span tied to one attempt.

    ``sequence_id`` is issued by the store per rollout on first insert: the order the store
    *received* spans, never clock-dependent, but not the order they happened (LLM calls are stored
    behind the proxy's answers; credit orders by the spans' times, see ``adapters.timeline``).
    Inserting the same ``(rollout_id, attempt_id, span_id)`` twice keeps the first copy, so
    retried writes never duplicate.
    """

    rollout_id: Key
    attempt_id: Key
    span_id: Key = Field(default_factory=lambda: f"{_random_bits(64):016x}")
    trace_id: str = Field(default_factory=lambda: f"{_random_bits(128):032x}")
    parent_id: str | None = None
    name: Name
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    status: SpanStatus = Field(default_factory=SpanStatus)
    attributes: dict[str, Any] = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list)
    resource: dict[str, Any] = Field(default_factory=dict)
    sequence_id: StoredInt | None = None


class LLM(BaseModel):
    """An OpenAI-compatible endpoint and the model behind it.

    ``sampling`` holds the sampling settings the agent should pass to its client (``temperature``,
    ``max_tokens``…); algorithms write into it (GRPO: its training temperature, greedy for
    validation). ``sampling_parameters`` is the same dictionary under the name Agent Lightning
    uses: accepted when the model is created and readable as a property, so code written for
    either name reads the value that was set — never silently dropped.
    """

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _sampling_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sampling_parameters" in data:
            data = dict(data)
            given = data.pop("sampling_parameters")
            if "sampling" in data and data["sampling"] != given:
                raise ValueError(
                    f"LLM got both sampling={data['sampling']!r} and sampling_parameters={given!r}; "
                    "they are one setting under two names: give one"
                )
            data["sampling"] = given
        return data

    @property
    def sampling_parameters(self) -> dict[str, Any]:
        """``sampling`` under Agent Lightning's name (the same dictionary, not a copy)."""
        return self.sampling

    @property
    def base_url(self) -> str:
        return self.endpoint


class PromptTemplate(BaseModel):
    """A prompt text with ``{placeholders}`` (f-string engine) or Jinja syntax.

    ``variables`` (optional) lists what the agent supplies; when given, a template that reads
    anything else is refused as it is created — so a bad template fails once, when published,
    naming the variables, instead of on every rollout.
    """

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["f-string", "jinja"] = "f-string"
    variables: list[str] | None = None

    @model_validator(mode="after")
    def _check_variables(self) -> PromptTemplate:
        if self.variables is not None:
            missing = self.referenced_variables() - set(self.variables)
            if missing:
                raise TemplateError(
                    f"template references variable(s) {sorted(missing)} that the agent does not supply "
                    f"(available: {sorted(self.variables)})",
                    missing,
                )
        return self

    def referenced_variables(self) -> set[str]:
        """The top-level variable names the template reads (``{task.question}`` → ``task``).

        Raises :class:`TemplateError` when the template does not parse under its engine, or
        (f-string) uses positional fields, which no ``format(**variables)`` call can fill.
        """
        if self.engine == "jinja":
            import jinja2  # lazy: only Jinja templates need it
            from jinja2 import meta

            try:
                return set(meta.find_undeclared_variables(jinja2.Environment().parse(self.template)))
            except jinja2.TemplateSyntaxError as exc:
                raise TemplateError(f"Jinja template does not parse: {exc.message} (line {exc.lineno})") from None
        names: set[str] = set()
        try:
            fields = list(string.Formatter().parse(self.template))
        except ValueError as exc:
            raise TemplateError(
                f"f-string template does not parse: {exc} (write literal braces as {{{{ }}}})"
            ) from None
        for _, field_name, _, _ in fields:
            if field_name is None:
                continue
            root = re.match(r"^[^.\[]*", field_name).group(0)  # type: ignore[union-attr]
            if not root or root.isdigit():
                raise TemplateError(
                    f"f-string template has a positional field {{{field_name}}}; name every "
                    "variable (e.g. {question})"
                )
            names.add(root)
        return names

    def format(self, **variables: Any) -> str:
        if self.engine == "jinja":
            import jinja2  # lazy: only Jinja templates need it

            env = jinja2.Environment(undefined=jinja2.StrictUndefined)
            return env.from_string(self.template).render(**variables)
        return self.template.format(**variables)


class JsonResource(BaseModel):
    """Any other named JSON value shipped to agents with the resources."""

    resource_type: Literal["json"] = "json"
    value: Any = None


Resource = LLM | PromptTemplate | JsonResource
#: One named item of a snapshot; ``resource_type`` says which model it is.
ResourceItem = Annotated[Resource, Field(discriminator="resource_type")]


class Resources(BaseModel):
    """An immutable, versioned snapshot of everything an agent may need."""

    resources_id: str
    version: int
    create_time: float = Field(default_factory=now)
    items: dict[str, ResourceItem] = Field(default_factory=dict)

    @field_validator("items", mode="before")
    @classmethod
    def _wrap_plain_values(cls, value: Any) -> Any:
        # Accept plain JSON values next to typed resources: ``{"temperature": 0.7}``.
        if isinstance(value, dict):
            return {
                k: v
                if isinstance(v, BaseModel) or (isinstance(v, dict) and "resource_type" in v)
                else {"resource_type": "json", "value": v}
                for k, v in value.items()
            }
        return value

    def get(self, name: str) -> Resource:
        try:
            return self.items[name]
        except KeyError:
            raise KeyError(
                f"resources {self.resources_id!r} have no item named {name!r} (have: {sorted(self.items)})"
            ) from None

    __getitem__ = get  # ``resources["llm"]``: what an agent's author writes first

    def first(self, kind: type[Resource]) -> Resource | None:
        """The first item of a kind (e.g. the one ``LLM``), or None."""
        return next((v for v in self.items.values() if isinstance(v, kind)), None)


class Worker(BaseModel):
    """A runner process as the store sees it (for the dashboard and for debugging)."""

    worker_id: Key
    status: Literal["idle", "busy", "stopped"] = "idle"
    current_rollout_id: str | None = None
    current_attempt_id: str | None = None
    last_heartbeat_time: FiniteFloat = Field(default_factory=now)
    metadata: dict[str, Any] = Field(default_factory=dict)


class MetricRecord(BaseModel):
    """One step of training metrics, stored so the dashboard can plot learning curves."""

    run_id: Key = "default"
    step: int = Field(ge=0, le=MAX_STEP)
    time: FiniteFloat = Field(default_factory=now)
    #: Finite numbers only (refused by the store naming the metric).
    values: dict[str, float]


class Transition(BaseModel):
    """One training sequence made from one LLM call (or several merged calls)."""

    rollout_id: str
    attempt_id: str
    group_id: str | None = None
    index: int
    agent_name: str | None = None
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float] | None = None
    response_mask: list[int] | None = None
    reward: float = 0.0
    advantage: float = 0.0
    model_version: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
