"""The full demo: the calculator agent must visibly learn on CPU (minutes; run with -m slow)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")


@pytest.mark.slow
def test_demo_raises_greedy_success(tmp_path):
    from agentgrad.demo import run_demo

    summary = run_demo(minutes=8, output_dir=tmp_path)
    assert summary["greedy_success_after"] >= summary["greedy_success_before"] + 0.15, summary
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    assert (tmp_path / "store.sqlite").exists()
