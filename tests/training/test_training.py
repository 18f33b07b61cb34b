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
    assert diag["ratio_max"].item() == pytest.approx(math.exp(0.5), abs=1e-5)  # the masked token does not count
    # KL (k3) to a reference that equals the policy is zero; a different one adds kl_coef · k3.
    ref = logprobs + torch.tensor([[0.1, 0.0, 0.0, 0.0]])
    loss_kl, diag_kl = ppo_clip_loss(logprobs, old, adv, mask, ref_logprobs=ref, kl_coef=0.5)
    k3 = math.exp(0.1) - 0.1 - 1
    assert diag_kl["kl"].item() == pytest.approx(k3, abs=1e-6)
    assert loss_kl.item() == pytest.approx(expected + 0.5 * k3 / 3, abs=1e-5)


@pytest.mark.parametrize(
    ("decay", "step", "expected"),
    [
        ("none", 3, 1e-3),
        # linear over 5 steps to 0.1: t = step / 4; lr × (0.1 + 0.9 × (1 − t))
        ("linear", 0, 1e-3),
        ("linear", 1, 0.775e-3),
        ("linear", 4, 0.1e-3),
        # cosine: lr × (0.1 + 0.9 × (1 + cos(π t)) / 2); t = 0.5 → 0.55
        ("cosine", 2, 0.55e-3),
        ("cosine", 1, (0.1 + 0.45 * (1 + math.cos(math.pi / 4))) * 1e-3),
        ("cosine", 4, 0.1e-3),
        ("cosine", 9, 0.1e-3),  # past the horizon (a resumed, longer run): the final rate
    ],
)
def test_decayed_lr_matches_hand_computation(decay, step, expected):
    from agentgrad.training.policy import decayed_lr

    assert decayed_lr(1e-3, step, 5, decay=decay, final=0.1) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"lr_decay": "step"}, "lr_decay must be"), ({"lr_decay": "cosine", "lr_final": 1.5}, "lr_final must be")],
)
def test_bad_lr_decay_settings_are_refused_when_configured(setting, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**setting)


def test_the_trainer_follows_its_lr_decay_and_reports_the_rate(tiny_model_dir):
    good, bad = _samples()
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, lr_decay="linear", lr_final=0.1))
    with pytest.raises(ValueError, match="total_steps"):
        trainer.ppo_step(good + bad)
    trainer.total_steps = 3
    rates = [trainer.ppo_step(good + bad).lr for _ in range(3)]
    assert rates == pytest.approx([1e-3, 0.55e-3, 0.1e-3], rel=1e-9)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1e-3, rel=1e-9)
    constant = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3)).ppo_step(good + bad)
    assert constant.lr == 1e-3 and constant.ratio_max == pytest.approx(1.0, abs=1e-5)  # on-policy: ratio 1


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
    assert all(a > b + 0.5 for a, b in zip(after_good, before_good, strict=True))
    assert all(a < b - 0.5 for a, b in zip(after_bad, before_bad, strict=True))
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


def test_log_kl_measures_the_distance_to_the_start_weights_without_changing_the_update(tiny_model_dir):
    good, bad = _samples()
    plain = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3))
    logged = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3, log_kl=True))
    steps = [(plain.ppo_step(good + bad), logged.ppo_step(good + bad)) for _ in range(2)]
    assert abs(steps[0][1].kl) < 1e-7 < steps[1][1].kl  # the first step starts at the start weights, then moves
    assert [p.kl for p, _ in steps] == [0.0, 0.0]  # without log_kl nothing is measured
    for (name, a), b in zip(plain.model.named_parameters(), logged.model.parameters(), strict=True):
        assert torch.equal(a, b), name  # kl_coef 0: the measurement does not enter the loss


def test_zero_advantage_samples_with_kl_pull_the_policy_back_to_the_start(tiny_model_dir):
    # GRPO's agreeing_groups="regularize": groups without signal train with advantage 0, so only the KL acts
    good, bad = _samples()
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=3e-3, kl_coef=1.0))
    for _ in range(3):
        trainer.ppo_step(good + bad)  # moves away from the start weights
    zero = [Sample(s.prompt_ids, s.response_ids, advantage=0.0) for s in good + bad]
    kls = [trainer.ppo_step(zero).kl for _ in range(3)]  # each measured before its own update
    assert kls[0] > 0 and kls[2] < kls[1] < kls[0], kls


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
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model_dir), str(ckpt), "100"], stdout=subprocess.PIPE, text=True, env=env
    )
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
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), str(ckpt), str(saved["step"] + 2)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    lines = out.stdout.splitlines()
    assert lines[0] == f"start {saved['step']} {saved['cursor']}", out.stderr[-2000:]
    assert lines[1] == f"step {saved['step'] + 1}"
    assert lines[-1] == f"done {saved['step'] + 2}"
    final = json.loads((ckpt / (ckpt / "latest").read_text() / "state.json").read_text())
    assert final["cursor"] == (saved["step"] + 2) * 4


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_runs_each_layer_again_and_changes_nothing_else(model_zoo, kind, lora):
    """With ``gradient_checkpointing`` every layer runs again in the backward pass, though the
    trainer steps in eval mode (dropout off; transformers checkpoints only layers in train mode),
    and the update is the one made without it. The rows then do not share their common prefix:
    each layer sees whole rows, once forward and once again backward."""
    from agentgrad.training import LoraSettings

    good, bad = _samples()
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in good + bad)
    updates, widths_seen = [], []
    for checkpointing in (False, True):
        config = TrainConfig(lr=1e-3, gradient_checkpointing=checkpointing, lora=LoraSettings(r=4) if lora else None)
        trainer = PolicyTrainer(model_zoo[kind], config)
        seen: list[int] = []
        attentions = [m for m in trainer.model.modules() if type(m).__name__.endswith("Attention")]
        for module in attentions:
            module.register_forward_hook(
                lambda _m, args, kwargs, _out, seen=seen: seen.append(
                    (args[0] if args else kwargs["hidden_states"]).shape[1]
                ),
                with_kwargs=True,
            )
        metrics = trainer.ppo_step(good + bad)
        widths_seen.append(sorted(seen))
        updates.append((metrics, {k: v.detach().clone() for k, v in trainer.model.named_parameters()}))
    layers = len(attentions)
    assert len(widths_seen[0]) == 2 * layers and max(widths_seen[0]) < width  # the shared prefix, then the rest
    assert widths_seen[1] == [width] * (2 * layers)  # whole rows, each layer twice: forward and recompute
    (plain, plain_weights), (checkpointed, checkpointed_weights) = updates
    assert checkpointed.loss == pytest.approx(plain.loss, rel=1e-4, abs=1e-6)
    assert checkpointed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-3)
    assert plain.ratio_max == pytest.approx(1.0) and checkpointed.ratio_max == pytest.approx(1.0)  # no dropout
    for name, value in plain_weights.items():
        torch.testing.assert_close(checkpointed_weights[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_autocast_runs_every_forward_in_bf16_keeps_the_weights_in_float32_and_still_learns(tiny_model_dir, lora):
    """``TrainConfig(autocast="bfloat16")``: the layers' products run in bf16 in the updates, the
    proximal pass (TIS) and ``sequence_logprob`` alike, while the weights (and so the optimizer's
    state) stay float32; the logprobs are float32's to a few hundredths, and PPO still moves them."""
    from agentgrad.training import LoraSettings

    good, bad = _samples()
    settings = dict(lr=3e-3, tis_cap=2.0, lora=LoraSettings(r=4) if lora else None)
    plain = PolicyTrainer(tiny_model_dir, TrainConfig(**settings))
    mixed = PolicyTrainer(tiny_model_dir, TrainConfig(**settings, autocast="bfloat16"))
    seen: list[torch.dtype] = []
    projection = next(m for name, m in mixed.model.named_modules() if name.endswith("mlp.down_proj"))
    projection.register_forward_hook(lambda _m, _args, out: seen.append(out.dtype))

    exact, approximate = plain.sequence_logprob(good + bad), mixed.sequence_logprob(good + bad)
    assert seen == [torch.bfloat16] * len(good + bad)
    assert approximate != exact
    assert max(abs(a - b) for a, b in zip(approximate, exact, strict=True)) < 0.1 * 3  # 3 response tokens each

    seen.clear()
    for _ in range(4):
        mixed.ppo_step(good + bad)
    # each step: the proximal pass and the update, each a run of the shared prefix and one of the rest
    assert set(seen) == {torch.bfloat16} and len(seen) == 4 * 2 * 2
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    after_good, after_bad = mixed.sequence_logprob(good), mixed.sequence_logprob(bad)
    assert all(a > b + 0.5 for a, b in zip(after_good, approximate[: len(good)], strict=True))
    assert all(a < b - 0.5 for a, b in zip(after_bad, approximate[len(good) :], strict=True))


def test_autocast_takes_bfloat16_only():
    with pytest.raises(ValueError, match="autocast"):
        TrainConfig(autocast="float16")  # type: ignore[arg-type]
