"""The full demo with its defaults: the calculator agent reaches the issue's target on CPU
(minutes; run with -m slow)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py


@pytest.mark.slow
def test_demo_reaches_the_success_target(tmp_path):
    from agentgrad.demo.run import run_demo

    summary = run_demo(output_dir=tmp_path)
    assert summary["greedy_success_after"] >= 0.75, summary
    assert summary["greedy_success_after"] >= summary["greedy_success_before"] + 0.2, summary
    assert summary["wall_seconds"] <= 600, summary
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    assert (tmp_path / "store.sqlite").exists()
