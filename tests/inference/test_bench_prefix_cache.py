"""``bench/bench_prefix_cache.py`` runs and reports what it claims (no timing is asserted): the same
prompt tokens with prefix caching off and on, most of them reused when it is on, and the same
sampled tokens for every rollout of the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_prefix_cache.py"


def test_the_prefix_cache_bench_reports_both_settings_over_the_same_work(tiny_model_dir: Path) -> None:
    options = ["--model", str(tiny_model_dir), "--tasks", "3", "--group", "4", "--max-tokens", "6", "--rounds", "2"]
    done = subprocess.run([sys.executable, str(BENCH), *options], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    first, second = report["rounds"]
    for turn in ("turn1", "turn2"):
        assert second["off"][turn]["same_tokens_off_twice"] == 1.0
        off, on = first["off"][turn], first["on"][turn]
        assert off["prompt_tokens"] == on["prompt_tokens"] == off["prefill_tokens"]
        assert on["prefill_tokens"] + on["reused_prompt_tokens"] == on["prompt_tokens"]
        assert on["reused_prompt_tokens"] > on["prompt_tokens"] / 2
        assert on["same_tokens_as_off"] == 1.0 and on["completion_tokens"] == off["completion_tokens"] > 0
    assert set(report["speedup"]) == {"turn1", "turn2"}
