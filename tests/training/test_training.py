"""PPO loss by hand, real optimizer steps on the tiny model, micro-batching, kill + resume."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgrad.training import PolicyTrainer, Sample, TrainConfig, micro_batches, ppo_clip_loss  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_ppo_clip_loss_matches_hand_computation():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, -0.3]])
    old = torch.tensor([[-1.5, -1.5, -0.5, float("nan")]])
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    loss, diag = ppo_clip_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    # token 0: r = e^0.5 = 1.6487 > 1.28, A > 0 → clipped branch: -1.28
    # token 1: r = e^-0.5 = 0.6065 < 0.8, A < 0 → clipped branch: +0.8
    # token 2: masked out; token 3: old logprob unknown → r = 1 → -1.0
    expected = (-1.28 + 0.8 - 1.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert diag["clipped"].item() == 2 and diag["tokens"].item() == 3
    assert diag["ratio"].item() == pytest.approx(math.exp(0.5) + math.exp(-0.5) + 1.0, abs=1e-5)
    # KL (k3) to a reference that equals the policy is zero; a different one adds kl_coef · k3.
    ref = logprobs + torch.tensor([[0.1, 0.0, 0.0, 0.0]])
    loss_kl, diag_kl = ppo_clip_loss(logprobs, old, adv, mask, ref_logprobs=ref, kl_coef=0.5)
    k3 = math.exp(0.1) - 0.1 - 1
    assert diag_kl["kl"].item() == pytest.approx(k3, abs=1e-6)
    assert loss_kl.item() == pytest.approx(expected + 0.5 * k3 / 3, abs=1e-5)


def test_micro_batches_respect_token_budget():
    samples = [Sample([1] * n, [2, 3]) for n in (3, 10, 4, 30)]
    batches = micro_batches(samples, token_budget=24)
    assert [[s.length for s in b] for b in batches] == [[5, 6], [12], [32]]


def _samples():
    prefix = list(range(3, 40))  # a shared "system prompt"
    good = [Sample(prefix + [50 + i], [100, 101, 102], advantage=1.0) for i in range(3)]
    bad = [Sample(prefix + [60 + i], [200, 201, 202], advantage=-1.0) for i in range(3)]
    return good, bad


def test_ppo_steps_raise_rewarded_completions_likelihood(tiny_model_dir):
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3))
    good, bad = _samples()
    before_good, before_bad = trainer.sequence_logprob(good), trainer.sequence_logprob(bad)
    for s in good + bad:  # the engine's sampled logprobs play the old policy
        s.old_logprobs = None
    for _ in range(4):
        metrics = trainer.ppo_step(good + bad)
    after_good, after_bad = trainer.sequence_logprob(good), trainer.sequence_logprob(bad)
    assert all(a > b + 0.5 for a, b in zip(after_good, before_good))
    assert all(a < b - 0.5 for a, b in zip(after_bad, before_bad))
    assert metrics.tokens == 18 and 0.0 <= metrics.clip_fraction <= 1.0 and metrics.entropy > 0
    assert trainer.step == 4


def test_epochs_and_mini_batches_make_several_clipped_updates_in_one_step(tiny_model_dir):
    good, bad = _samples()
    old = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3))
    for s in good + bad:  # sampled by the initial policy
        s.old_logprobs = [float(x) for x in _response_logprobs(old, s)]
    single = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3)).ppo_step(good + bad)
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3, clip_eps_low=0.01, clip_eps_high=0.01))
    metrics = trainer.ppo_step(good + bad, mini_batches=3, epochs=2)
    assert trainer.step == 1 and metrics.updates == 6 and single.updates == 1
    assert metrics.tokens == 2 * single.tokens  # each epoch trains every token once
    assert single.clip_fraction == 0.0 < metrics.clip_fraction  # later updates are off-policy
    with pytest.raises(ValueError, match="mini_batches and epochs"):
        trainer.ppo_step(good + bad, epochs=0)


def _response_logprobs(trainer, sample):
    from agentgrad.training.policy import _layout, token_logprobs

    batch = _layout([sample], trainer.device)
    with torch.no_grad():
        logprobs, _ = token_logprobs(trainer.model, batch)
    return logprobs[batch.mask.bool()].tolist()


def test_micro_batching_and_prefix_sharing_do_not_change_the_update(tiny_model_dir):
    good, bad = _samples()
    results = []
    for budget in (10_000, 1):  # one micro-batch with a shared prefix vs one sample per micro-batch
        trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, micro_batch_tokens=budget))
        trainer.ppo_step(good + bad)
        results.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    for name, value in results[0].items():
        assert torch.allclose(value, results[1][name], atol=1e-5), name


def test_lora_kl_reference_is_the_disabled_adapter(tiny_model_dir):
    from agentgrad.training import LoraSettings

    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2, lora=LoraSettings(r=4), kl_coef=0.1))
    good, bad = _samples()
    first = trainer.ppo_step(good + bad)
    assert first.kl == pytest.approx(0.0, abs=1e-6)  # adapter starts at zero: policy == reference
    second = trainer.ppo_step(good + bad)
    assert second.kl > 0
    state = trainer.engine_state_dict()
    assert not any("lora_" in k or "base_layer" in k for k in state)


_RESUME_SCRIPT = textwrap.dedent("""
    import sys, time
    from agentgrad.training import PolicyTrainer, Sample, TrainConfig, fit_sequences
    model_dir, ckpt = sys.argv[1], sys.argv[2]
    trainer = PolicyTrainer(model_dir, TrainConfig(lr=1e-3))
    samples = [Sample([1, 2, 3, 4 + i], [10 + i, 11]) for i in range(10)]
    state = trainer.load_checkpoint(ckpt)
    print("start", trainer.step, state["cursor"] if state else 0, flush=True)
    def on_step(step, metrics):
        print("step", step, flush=True)
        time.sleep(0.3)
    fit_sequences(trainer, samples, steps=int(sys.argv[3]), batch_size=4, checkpoint_dir=ckpt, on_step=on_step)
    print("done", trainer.step, flush=True)
""")


def test_sigkill_during_training_then_resume_continues_step_and_cursor(tiny_model_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_RESUME_SCRIPT)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir), str(ckpt), "100"],
                            stdout=subprocess.PIPE, text=True, env=env)
    seen = 0
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("step"):
            seen = int(line.split()[1])
            if seen >= 3:
                break
        assert time.monotonic() < deadline
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    import json

    saved = json.loads((ckpt / (ckpt / "latest").read_text() / "state.json").read_text())
    assert saved["step"] >= 3 and saved["cursor"] == saved["step"] * 4
    out = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(ckpt), str(saved["step"] + 2)],
                         capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0] == f"start {saved['step']} {saved['cursor']}", out.stderr[-2000:]
    assert lines[1] == f"step {saved['step'] + 1}"
    assert lines[-1] == f"done {saved['step'] + 2}"
    final = json.loads((ckpt / (ckpt / "latest").read_text() / "state.json").read_text())
    assert final["cursor"] == (saved["step"] + 2) * 4
