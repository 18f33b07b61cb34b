"""The main job learns for real: a few GRPO steps of the demo raise greedy held-out success.

Runs the whole demo stack (SQLite store, engine, model server, proxy, two runner processes) on
the built-in tiny model, which the first call builds (minutes; cached afterwards). About a
minute of training: the warm-up leaves the model skipping its calculator for questions in words,
and GRPO must teach it to call the tool for those too.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py


@pytest.mark.timeout(1500)
def test_a_few_demo_steps_raise_greedy_success(tmp_path):
    from agentgrad.demo.run import run_demo

    summary = run_demo(steps=6, minutes=5, output_dir=tmp_path, settings={"val_size": 64, "val_every": 0})
    before, after = summary["greedy_success_before"], summary["greedy_success_after"]
    assert before is not None and after is not None, summary
    assert after >= before + 0.2 and after >= 0.7, summary
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
