"""The vLLM launcher: its command line everywhere, a real launch only with a GPU and vLLM."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from agentgrad.inference.vllm import launch_vllm, vllm_available, vllm_command


def test_command_enables_lora_and_tool_parsing() -> None:
    cmd = vllm_command("Qwen/Qwen2.5-0.5B-Instruct", port=8123, served_model_name="policy")
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-lora", "--enable-auto-tool-choice", "--enable-prefix-caching"):
        assert flag in cmd
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes"
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--served-model-name") + 1] == "policy"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="needs vLLM and a CUDA GPU")
def test_vllm_serves_token_ids(tiny_model_dir: Path) -> None:
    proc, url = launch_vllm(tiny_model_dir, port=18765, extra_args=["--max-model-len", "1024"])
    try:
        body = httpx.post(
            f"{url}/chat/completions",
            json={
                "model": str(tiny_model_dir),
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "return_token_ids": True,
                "logprobs": True,
            },
            timeout=120,
        ).json()
        assert body["prompt_token_ids"] and len(body["choices"][0]["token_ids"]) >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)
