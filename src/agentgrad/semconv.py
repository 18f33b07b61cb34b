"""Span names and attribute keys: the one place they are defined (docs/reference/spans.md).

OpenTelemetry GenAI semantic conventions (``gen_ai.*``) are used where they exist; everything
AgentGrad-specific lives under ``agentgrad.*``.
"""

# Span names.
SPAN_LLM_CALL = "agentgrad.llm.call"
SPAN_REWARD = "agentgrad.reward"
SPAN_MESSAGE = "agentgrad.message"
SPAN_OBJECT = "agentgrad.object"
SPAN_EXCEPTION = "agentgrad.exception"
SPAN_OPERATION = "agentgrad.operation"
SPAN_AGENT = "agentgrad.agent"

# Rollout context (also accepted on OTLP resources).
ROLLOUT_ID = "agentgrad.rollout_id"
ATTEMPT_ID = "agentgrad.attempt_id"

# Agent tagging.
AGENT_NAME = "agentgrad.agent.name"

# HTTP headers that tag an LLM request with its rollout (set by ``agentgrad.instrument()``, read
# by the proxy). ``X-Agentgrad-Parent-Id`` carries the enclosing ``agent()``/``operation`` span id,
# which is not a W3C span id and so cannot travel in ``traceparent``.
HEADER_ROLLOUT_ID = "X-Rollout-Id"
HEADER_ATTEMPT_ID = "X-Attempt-Id"
HEADER_AGENT_NAME = "X-Agent-Name"
HEADER_PARENT_ID = "X-Agentgrad-Parent-Id"

# Rewards.
REWARD_VALUE = "agentgrad.reward.value"
REWARD_PREFIX = "agentgrad.reward."
REWARD_PRIMARY = "agentgrad.reward.primary"

# LLM calls.
LLM_PROMPT_TOKEN_IDS = "agentgrad.llm.prompt_token_ids"
LLM_COMPLETION_TOKEN_IDS = "agentgrad.llm.completion_token_ids"
LLM_LOGPROBS = "agentgrad.llm.logprobs"
LLM_REQUEST = "agentgrad.llm.request"
LLM_RESPONSE = "agentgrad.llm.response"
LLM_LATENCY = "agentgrad.llm.latency_seconds"
MODEL_VERSION = "agentgrad.model.version"
#: Which OpenAI API the client called: "chat", "responses" or "completions".
LLM_API = "agentgrad.llm.api"
#: The body the proxy sent upstream (differs from the request for the Responses API, which is
#: translated to chat): the token ids belong to this rendering.
LLM_UPSTREAM_REQUEST = "agentgrad.llm.upstream_request"
LLM_STREAMED = "agentgrad.llm.streamed"
LLM_FINISH_REASON = "agentgrad.llm.finish_reason"

# Messages, objects, exceptions, operations.
MESSAGE_BODY = "agentgrad.message.body"
OBJECT_JSON = "agentgrad.object.json"
OBJECT_TYPE = "agentgrad.object.type"
OPERATION_NAME = "agentgrad.operation.name"
OPERATION_INPUT = "agentgrad.operation.input"
OPERATION_OUTPUT = "agentgrad.operation.output"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"

# GenAI conventions we fill on LLM call spans.
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
