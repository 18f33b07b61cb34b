"""``serve-model`` and ``models build-tiny`` through a small argparse parser, as the main CLI wires them."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentgrad.cli.named_models import prefix_cache_mb
from agentgrad.cli.serve_model import add_commands

SRC = str(Path(__file__).resolve().parents[2] / "src")
#: The real entry point (``agentgrad …``): its logging set-up decides whether the URL line shows.
RUNNER = "import sys\nfrom agentgrad.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_serve_model_defaults() -> None:
    args = _parser().parse_args(["serve-model", "tiny"])
    assert (args.host, args.engine, args.device, args.model) == ("127.0.0.1", "hf", "cpu", "tiny")
    assert (args.token, args.allowed_hosts, args.max_body_bytes) == (None, [], 32 * 1024 * 1024)
    assert (args.prefix_caching, args.prefix_cache_mb, prefix_cache_mb(args)) == (True, None, 256.0)


def test_serve_model_prefix_cache_flags(capsys) -> None:
    args = _parser().parse_args(["serve-model", "tiny", "--no-prefix-caching", "--prefix-cache-mb", "0"])
    assert (args.prefix_caching, args.prefix_cache_mb) == (False, 0.0)
    for bad in ("-1", "lots", "nan"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["serve-model", "tiny", "--prefix-cache-mb", bad])
        assert "--prefix-cache-mb" in capsys.readouterr().err


def test_serve_model_serves_and_stops_on_sigterm(tiny_model_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), AGENTGRAD_MODEL_TOKEN="tok"
    )  # the token comes from the environment, off the command line
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            RUNNER,
            "serve-model",
            str(tiny_model_dir),
            "--port",
            str(port),
            "--served-model-name",
            "calc",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 401
                models = httpx.get(
                    f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer tok"}, timeout=2
                ).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
        assert models["data"][0]["id"] == "calc"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert f"http://127.0.0.1:{port}/v1" in output and "stopped" in output
    finally:
        if proc.poll() is None:
            proc.kill()
