"""Launch vLLM's OpenAI-compatible server with the flags training needs.

vLLM is the GPU engine: an optional extra (``pip install agentgrad[vllm]``, CUDA wheels). The
launcher enables LoRA loading at runtime and returns the endpoint once ``/health`` answers.
Token ids come back per request with ``return_token_ids: true`` (vLLM >= 0.10.2), the same field
our own engine honours.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from agentgrad.http.serve import http_url
from agentgrad.http.transport import request_json


def vllm_command(
    model: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    max_loras: int = 4,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The ``vllm serve`` command line: LoRA enabled, prefix caching on, tool calls parsed."""
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    return cmd + list(extra_args or [])


def launch_vllm(
    model: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    timeout: float = 900.0,
    extra_args: list[str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start vLLM and wait until it is healthy; returns (process, base URL ``http://host:port/v1``).

    Runtime LoRA updates (``/v1/load_lora_adapter``) are enabled through
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``. Raises ``RuntimeError`` if vLLM is not installed or
    exits before it is healthy.
    """
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("vLLM is not installed: pip install 'agentgrad[vllm]' (needs CUDA)")
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    proc = subprocess.Popen(
        vllm_command(model, host=host, port=port, served_model_name=served_model_name, extra_args=extra_args), env=env
    )
    base = http_url(host, port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with code {proc.returncode} before becoming healthy")
        try:
            if request_json("GET", f"{base}/health", timeout=2).status == 200:
                return proc, f"{base}/v1"
        except OSError:  # not listening yet
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"vLLM did not become healthy within {timeout:.0f}s")


def vllm_available() -> bool:
    """True when vLLM is importable and a CUDA GPU is visible (what its tests need)."""
    return shutil.which("nvidia-smi") is not None and importlib.util.find_spec("vllm") is not None
