#!/usr/bin/env bash
# Install the agent frameworks the capture tests run (tests/frameworks, tests/frameworks_compat).
#
# Two environments, because the frameworks disagree about openai (docs/capture.md):
#   .venv         openai 3.x: LangChain/LangGraph, OpenAI Agents SDK, AutoGen, smolagents, OpenInference
#   .venv-compat  openai 2.x: CrewAI and LlamaIndex (both pin openai<3), plus agentgrad itself
# Versions are the ones the tests passed with. Usage: scripts/setup_framework_envs.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3.11}"

test -x .venv/bin/python || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q \
    "langchain-openai==1.7.3" "langgraph==1.2.22" \
    "openai-agents==0.24.0" \
    "autogen-agentchat==0.7.5" "autogen-ext[openai]==0.7.5" \
    "smolagents==1.26.0" \
    "openinference-instrumentation-openai==0.1.66"

test -x .venv-compat/bin/python || "$PYTHON" -m venv .venv-compat
.venv-compat/bin/python -m pip install -q -e . \
    "crewai==1.15.30" "llama-index-core==0.14.25" "llama-index-llms-openai==0.8.3" \
    "openai==2.54.0" "fastapi>=0.110" "uvicorn>=0.29" "pytest>=8" "pytest-timeout>=2.3"
