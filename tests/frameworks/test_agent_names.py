"""Agent names inferred from the frameworks themselves (``agentgrad.tracing.agent_names``), fast.

No LLM here: each framework runs a two-agent program whose "model" (a scripted model, or an
agent that does not call one) records the name the openai-client hook would send at that
moment. The same programs against the real engine, through the proxy, are in
``test_fw_agent_names.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from agentgrad.context import RolloutContext, use_context
from agentgrad.emit import agent
from agentgrad.tracing import agent_names
from agentgrad.tracing.instrument import header_value, rollout_headers
from agentgrad.tracing.post_import import when_imported

agent_names.install()


@pytest.fixture
def rollout(memory_store) -> RolloutContext:
    """A rollout context as the runner sets it: the rollout's agent name is the fallback."""
    memory_store.enqueue_rollout({"q": 1})
    claimed = memory_store.dequeue_rollout("w")
    return RolloutContext(
        store=memory_store, rollout=claimed.rollout, attempt=claimed.attempt, agent_name="my_rollout_fn"
    )


def sent_name() -> str | None:
    """The agent name the openai-client hook sends for a request built now."""
    return rollout_headers().get("X-Agent-Name")


# ---- the rule: explicit scope > framework > the rollout's name ------------------------------------


def test_precedence(rollout: RolloutContext) -> None:
    with use_context(rollout):
        assert sent_name() == "my_rollout_fn"  # plain Python: the rollout's name
        with agent_names.entered_agent("writer"):
            assert sent_name() == "writer"  # a framework's agent beats the rollout's name
            with agent("judge"):
                assert sent_name() == "judge"  # an explicit scope beats inference
            assert sent_name() == "writer"
        with agent("judge"), agent_names.entered_agent("writer"):
            assert sent_name() == "judge"  # also when the scope is outside the framework's agent
        assert sent_name() == "my_rollout_fn"
    assert rollout_headers() == {}  # outside a rollout nothing is sent


def test_names_http_refuses_travel_percent_encoded(rollout: RolloutContext) -> None:
    from urllib.parse import unquote

    with use_context(rollout), agent_names.entered_agent("Rédacteur\nen chef 100%"):
        value = sent_name()
    assert value == "R%C3%A9dacteur%0Aen%20chef%20100%25" and value.isascii()
    assert unquote(value) == "Rédacteur\nen chef 100%"  # what the proxy stores
    assert header_value("check_query/agent") == "check_query/agent"  # ordinary names travel as they are


def test_entered_agent_ignores_missing_names() -> None:
    with agent_names.entered_agent(None), agent_names.entered_agent(""):
        assert agent_names.framework_agent_name() is None


def test_post_import_hook_runs_on_a_later_import(tmp_path, monkeypatch) -> None:
    (tmp_path / "agentgrad_probe_mod.py").write_text(
        textwrap.dedent("""
        def greet():
            return "hello"
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []

    def patch(module: Any) -> None:
        original = module.greet
        module.greet = lambda: original().upper()
        seen.append(module.__name__)

    when_imported("agentgrad_probe_mod", patch)
    assert seen == []  # not imported yet: nothing imported on our behalf
    try:
        from agentgrad_probe_mod import (
            greet,  # the importer already gets the patched function
        )

        assert greet() == "HELLO" and seen == ["agentgrad_probe_mod"]
        when_imported("agentgrad_probe_mod", lambda module: seen.append("again"))  # imported: runs now
        assert seen == ["agentgrad_probe_mod", "again"]
        assert sys.modules["agentgrad_probe_mod"].__loader__.__class__.__name__ == "SourceFileLoader"
    finally:
        sys.modules.pop("agentgrad_probe_mod", None)


def test_no_framework_is_imported_to_find_a_name() -> None:
    code = (
        "import sys; from agentgrad.tracing import instrument; instrument(); "
        "from agentgrad.tracing.agent_names import framework_agent_name; framework_agent_name(); "
        "heavy = [m for m in ('langchain_core', 'agents', 'autogen_agentchat', 'crewai', 'smolagents', "
        "'llama_index') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- LangGraph --------------------------------------------------------------------------------------


def test_langgraph_node_and_subgraph_path() -> None:
    pytest.importorskip("langgraph")
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        seen: list

    def node(state: State) -> dict:
        return {"seen": [*state["seen"], agent_names.framework_agent_name()]}

    inner = StateGraph(State)
    inner.add_node("agent", node)
    inner.add_edge(START, "agent")
    inner.add_edge("agent", END)
    graph = StateGraph(State)
    graph.add_node("write_query", node)
    graph.add_node("check_query", node)
    graph.add_node("rewriter", inner.compile())
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "check_query")
    graph.add_edge("check_query", "rewriter")
    graph.add_edge("rewriter", END)
    app = graph.compile()
    expected = ["write_query", "check_query", "rewriter/agent"]
    assert app.invoke({"seen": []})["seen"] == expected
    assert asyncio.run(app.ainvoke({"seen": []}))["seen"] == expected
    assert agent_names.framework_agent_name() is None


def test_langgraph_node_of_config() -> None:
    node_of = agent_names.langgraph_node_of
    assert (
        node_of({"metadata": {"langgraph_node": "write_query", "langgraph_checkpoint_ns": "write_query:1"}})
        == "write_query"
    )
    assert node_of({"metadata": {"langgraph_node": "agent", "langgraph_checkpoint_ns": "a:1|agent:2"}}) == "a/agent"
    assert node_of({"metadata": {"run_name": "chain"}}) is None  # plain LangChain: no node
    assert node_of({}) is None and node_of(None) is None


# ---- OpenAI Agents SDK ------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_handoff_switches_the_name(streamed: bool) -> None:
    pytest.importorskip("agents")
    from agents import Agent, Runner, set_tracing_disabled
    from agents.testing.model import (
        ModelStep,
        ScriptedModel,
        assistant_message,
        function_call,
    )

    set_tracing_disabled(True)
    seen: list[str | None] = []

    def step(output: list) -> ModelStep:
        def respond(call: Any) -> list:
            seen.append(agent_names.framework_agent_name())
            return output

        return ModelStep.respond(respond)

    model = ScriptedModel(
        [step([function_call("transfer_to_checker", {}, call_id="c1")]), step([assistant_message("fine")])]
    )
    checker = Agent(name="checker", model=model)
    writer = Agent(name="writer", model=model, handoffs=[checker])

    async def run() -> Any:
        if streamed:
            result = Runner.run_streamed(writer, "write")
            async for _ in result.stream_events():
                pass
            return result
        return await Runner.run(writer, "write")

    assert asyncio.run(run()).final_output == "fine"
    assert seen == ["writer", "checker"]


# ---- AutoGen ----------------------------------------------------------------------------------------


def test_autogen_agent_name_in_run_and_in_a_team() -> None:
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import BaseChatAgent
    from autogen_agentchat.base import Response
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.messages import TextMessage
    from autogen_agentchat.teams import RoundRobinGroupChat

    seen: list[str | None] = []

    class Probe(BaseChatAgent):
        @property
        def produced_message_types(self) -> tuple:
            return (TextMessage,)

        async def on_messages(self, messages: Any, cancellation_token: Any) -> Response:
            seen.append(agent_names.framework_agent_name())
            return Response(chat_message=TextMessage(content="ok", source=self.name))

        async def on_reset(self, cancellation_token: Any) -> None:
            pass

    async def main() -> None:
        writer, checker = Probe("writer", "writes"), Probe("checker", "checks")
        await writer.run(task="go")
        async for _ in checker.run_stream(task="go"):
            pass
        team = RoundRobinGroupChat([writer, checker], termination_condition=MaxMessageTermination(4))
        await team.run(task="go")

    asyncio.run(main())
    assert seen == ["writer", "checker", "writer", "checker", "writer"]


# ---- smolagents -------------------------------------------------------------------------------------


def test_smolagents_manager_and_managed_agent() -> None:
    pytest.importorskip("smolagents")
    from smolagents import Model, ToolCallingAgent
    from smolagents.models import (
        ChatMessage,
        ChatMessageToolCall,
        ChatMessageToolCallFunction,
    )

    seen: list[str | None] = []

    class Scripted(Model):
        def __init__(self, plan: list[tuple[str, dict]]) -> None:
            super().__init__(model_id="scripted")
            self.plan = plan

        def generate(
            self,
            messages: Any,
            stop_sequences: Any = None,
            response_format: Any = None,
            tools_to_call_from: Any = None,
            **kwargs: Any,
        ) -> ChatMessage:
            seen.append(agent_names.framework_agent_name())
            name, arguments = self.plan.pop(0)
            call = ChatMessageToolCall(
                id=f"c{len(seen)}",
                type="function",
                function=ChatMessageToolCallFunction(name=name, arguments=arguments),
            )
            return ChatMessage(role="assistant", content="", tool_calls=[call])

    checker = ToolCallingAgent(
        tools=[],
        model=Scripted([("final_answer", {"answer": "fine"})]),
        name="checker",
        description="checks a text",
        verbosity_level=0,
    )
    writer = ToolCallingAgent(
        tools=[],
        model=Scripted([("checker", {"task": "check"}), ("final_answer", {"answer": "done"})]),
        name="writer",
        managed_agents=[checker],
        verbosity_level=0,
    )
    assert writer.run("write") == "done"
    assert seen == ["writer", "checker", "writer"]
    seen.clear()
    streamer = ToolCallingAgent(
        tools=[], model=Scripted([("final_answer", {"answer": "s"})]), name="streamer", verbosity_level=0
    )
    between_steps = [agent_names.framework_agent_name() for _ in streamer.run("go", stream=True)]
    assert seen == ["streamer"]  # during the step
    assert set(between_steps) == {None}  # the consumer's code between steps is not the agent's


def test_patches_are_idempotent() -> None:
    module = pytest.importorskip("smolagents.agents")
    wrapped = module.MultiStepAgent.run
    agent_names.install()
    assert module.MultiStepAgent.run is wrapped
    assert not hasattr(wrapped._agentgrad_original, "_agentgrad_original")


def test_a_name_http_refuses_is_stored_as_given(rollout: RolloutContext) -> None:
    """Through an instrumented openai client and the real proxy: a CrewAI-style role with an
    accent (httpx refuses it in a header) reaches the store unchanged, and the call goes through."""
    import openai

    from agentgrad import semconv
    from agentgrad.proxy import LLMProxy
    from agentgrad.testing.stub import StubUpstream
    from agentgrad.tracing import instrument

    instrument()
    with StubUpstream(["one", "two"]) as stub, LLMProxy(rollout.store, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="k")
        with use_context(rollout):
            with agent_names.entered_agent("Rédacteur en chef"):
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        proxy.flush(rollout.rollout_id, rollout.attempt_id)
    spans = rollout.store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
    assert [s.attributes[semconv.AGENT_NAME] for s in spans] == ["Rédacteur en chef", "my_rollout_fn"]
