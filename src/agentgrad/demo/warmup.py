"""The warm-up SFT loop of the scenario models (``tiny-sql``, ``tiny-rag``): token sequences with a
loss mask, a *habit* drawn anew each time a sequence is trained on, batches of alike lengths, and
optional *skill phases* (:class:`Skill`): before it, one for each skill that forms abruptly; after it,
one for each skill it trains too rarely.

The calculator model (``demo/tiny.py``) has its own loop, which shares each batch's system turn;
the scenario models' prompts differ from one conversation to the next (a schema, a question), so
theirs pads whole sequences and sorts them by length instead.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad.inference.kv_cache import cache_kwargs, prefix_cache
from agentgrad.training.token_loss import trained_token_loss

#: Steps of linear learning-rate warm-up before the cosine decay.
LR_WARMUP_STEPS = 50


@dataclass(frozen=True)
class Sample:
    """One conversation as the model is trained on it: token ids, and a mask that is 1 on the tokens
    the model generates (its replies, each ending in ``<|im_end|>``) and 0 on the prompt."""

    ids: list[int]
    mask: list[int]
    #: The same conversation with a habitual (wrong) reply, trained on instead in ``habit_rate`` of
    #: the draws. Drawn anew each time: drawn once, a model learns *which* conversations have the
    #: habit and on new ones makes the mistake always or never, which leaves RL no variance.
    habit: Sample | None = None

    def draw(self, rng: random.Random, habit_rate: float) -> Sample:
        return self.habit if self.habit is not None and rng.random() < habit_rate else self


def shared_prefix(samples: list[Sample]) -> int:
    """How many first tokens every sample (and every habitual twin) has in common, untrained."""
    first = samples[0].ids
    length = min(len(s.ids) for s in samples)
    for sample in samples:
        for twin in (sample, sample.habit):
            if twin is None:
                continue
            length = min(length, twin.mask.index(1) if 1 in twin.mask else len(twin.ids))
            while twin.ids[:length] != first[:length]:
                length -= 1
    return length


def without_prefix(sample: Sample, length: int) -> Sample:
    habit = None if sample.habit is None else without_prefix(sample.habit, length)
    return Sample(sample.ids[length:], sample.mask[length:], habit)


def alike_length_batches(samples: list[Sample], size: int, rng: random.Random) -> list[list[int]]:
    """An epoch's batches (indices into ``samples``) of alike lengths, in random order: padding a
    short conversation to a long one's length would cost more than half of each step."""
    order = list(range(len(samples)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    chunk = size * 32
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: len(samples[i].ids))
        batches.extend(part[i : i + size] for i in range(0, len(part) - size + 1, size))
    rng.shuffle(batches)
    return batches


def warm_up(
    model: Any,
    samples: list[Sample],
    *,
    steps: int,
    batch_size: int,
    peak_lr: float,
    habit_rate: float,
    pad: int,
    rng: random.Random,
    after_step: Callable[[int, float], bool | None],
    prefix: list[int] | None = None,
    decay: bool = True,
) -> int:
    """Train ``model`` on ``samples`` for ``steps`` steps: AdamW at ``peak_lr`` after a linear
    warm-up, cosine decay to a tenth (``decay``; else constant), gradients clipped at 1.
    ``after_step(step, loss)`` runs after each step (evaluation, progress, thread count); it
    returns True to stop early. Returns the steps run.

    ``prefix``: tokens every sample starts with and that are not trained on (a system turn with
    the tools, shared by every conversation), left out of ``samples``; each step runs it once and
    shares its KV cache across the batch (the calculator model's trick), which halves the work
    when the prefix is half of every sequence."""
    import torch

    if steps < 1:  # a phase of no steps (``--steps 0``: the untrained model, its data prepared)
        return 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01, betas=(0.9, 0.98))

    def lr_factor(step: int) -> float:
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / steps))) if decay else 1.0
        return min(1.0, (step + 1) / LR_WARMUP_STEPS) * cosine

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    pending: list[list[int]] = []
    for step in range(1, steps + 1):
        if not pending:
            pending = alike_length_batches(samples, batch_size, rng)
        batch = [samples[i].draw(rng, habit_rate) for i in pending.pop()]
        width = max(len(s.ids) for s in batch)
        input_ids = torch.full((len(batch), width), pad)
        labels = torch.full((len(batch), width), -100)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, sample in enumerate(batch):
            ids = torch.tensor(sample.ids)
            input_ids[row, : len(ids)] = ids
            attention[row, : len(ids)] = 1
            labels[row, : len(ids)] = torch.where(torch.tensor(sample.mask, dtype=torch.bool), ids, -100)
        model.train()
        if prefix:
            kv_cache = prefix_cache(model, torch.tensor([prefix]), len(batch))
            attention = torch.cat([torch.ones((len(batch), len(prefix)), dtype=torch.long), attention], dim=1)
            loss = trained_token_loss(model, input_ids, labels, attention_mask=attention, **cache_kwargs(kv_cache))
        else:
            loss = trained_token_loss(model, input_ids, labels, attention_mask=attention)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if after_step(step, loss.item()):
            return step
    return steps


@dataclass
class Skill:
    """A phase that teaches one skill on its own: ``samples`` until ``probe()`` (greedy success on
    validation) reaches ``threshold``, probed every ``probe_every`` steps, at most ``max_steps``.

    Before the warm-up (:attr:`Prepared.skills`), an abrupt skill (the RAG model's copying of a
    name) at the recipe's constant learning rate: it forms after many steps at a constant rate and
    later when the rest of the task is mixed in (the calculator model's finding, ``demo/tiny.py``).
    After the warm-up (:attr:`Prepared.finish`), a skill the warm-up trains too rarely (the RAG
    model's answer after a second search), at ``peak_lr`` with ``decay``, for all its steps
    (``threshold`` None), with the habit drawn at ``habit_rate`` so that it keeps the odds the
    warm-up set."""

    #: What the manifest calls it (``skills.<name>.steps``).
    name: str
    samples: list[Sample]
    probe: Callable[[], float]
    #: Stop once the probe reaches it; None: run ``max_steps``.
    threshold: float | None
    probe_every: int
    max_steps: int
    #: The learning rate (None: the recipe's) and whether it decays (see :func:`warm_up`).
    peak_lr: float | None = None
    decay: bool = False
    #: How often a sample's habitual twin is drawn (:meth:`Sample.draw`).
    habit_rate: float = 0.0


@dataclass
class Prepared:
    """What a scenario model's recipe makes before its warm-up: the untrained model and its
    tokenizer (saved in the build directory), the samples, and how to score the model."""

    model: Any
    tokenizer: Any
    samples: list[Sample]
    #: Greedy behaviour on validation data (written to the manifest as ``val_greedy_<key>``).
    evaluate: Callable[[], dict[str, float]]
    #: Settings and counts of the recipe, for the manifest.
    manifest: dict[str, Any]
    #: Tokens every sample starts with, left out of ``samples`` (see :func:`warm_up`).
    prefix: list[int] | None = None
    #: Skill phases run, in order, before the warm-up, with the same prefix.
    skills: tuple[Skill, ...] = ()
    #: Skill phases run, in order, after the warm-up (the model is evaluated again after them).
    finish: tuple[Skill, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """A scenario model's recipe: its name and format (``agentgrad_build.json``), its SFT, and
    where the package ships a build of it."""

    name: str
    build_format: int
    batch_size: int
    peak_lr: float
    habit_rate: float
    #: The build the package ships (it may hold none): copied into the cache on first use.
    shipped: Path
    #: How messages name the model ("the SQL model").
    what: str

    def default_dir(self) -> Path:
        """Where the model lives: the models cache (``models/cache.py``), under its name."""
        from agentgrad.models.cache import models_cache_dir

        return models_cache_dir() / self.name

    def ensure(self, build: Callable[[Path], Any]) -> Path:
        """The model's directory: the cached build, else the shipped one copied there, else
        ``build(directory)`` (``demo/tiny.py``'s :func:`~agentgrad.demo.tiny.ensure_built`)."""
        from agentgrad.demo.tiny import ensure_built

        path = self.default_dir()
        ensure_built(path, self.shipped, self.build_format, build, self.what)
        return path


def build_model(
    out: Path,
    recipe: Recipe,
    prepare: Callable[[Path, Path], Prepared],
    *,
    steps: int,
    seed: int,
    threads: int | None,
    progress: bool,
    eval_every: int,
) -> Path:
    """Build a scenario model into ``out``, atomically: ``prepare(data_dir, build_dir)`` writes its
    data into a temporary directory and the untrained model into the build directory, then
    ``steps`` warm-up steps run, with ``evaluate`` every ``eval_every`` steps and at the end, and
    the model, tokenizer and manifest are saved. ``threads`` None follows the machine's load."""
    import tempfile
    import time

    import torch

    from agentgrad.demo.threads import AdaptiveThreads
    from agentgrad.models.cache import staged_dir

    started = time.monotonic()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    previous_threads = torch.get_num_threads()
    adaptive = AdaptiveThreads() if threads is None else None
    if adaptive is not None:
        adaptive.decide()
    else:
        torch.set_num_threads(threads or 1)
    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"agentgrad-{recipe.name}-data-") as data_dir,
            staged_dir(out, label="build") as tmp,
        ):
            prepared = prepare(Path(data_dir), tmp)
            skills = {
                skill.name: _skill_phase(skill, prepared, recipe, rng, progress, started) for skill in prepared.skills
            }
            report: dict[str, float] = {}

            def after_step(step: int, loss: float) -> bool:
                nonlocal report
                elapsed = f"({time.monotonic() - started:.0f}s)"
                if step % eval_every == 0 or step == steps:
                    report = prepared.evaluate()
                    if progress:
                        print(f"step {step:4d}  loss {loss:.3f}  val greedy: {_scores(report)}  {elapsed}", flush=True)
                elif progress and step % 50 == 0:
                    print(f"step {step:4d}  loss {loss:.3f}  {elapsed}", flush=True)
                if adaptive is not None and step % 25 == 0:
                    adaptive.decide()
                return False

            warm_up(
                prepared.model,
                prepared.samples,
                steps=steps,
                batch_size=recipe.batch_size,
                peak_lr=recipe.peak_lr,
                habit_rate=recipe.habit_rate,
                pad=prepared.tokenizer.pad_token_id,
                rng=rng,
                after_step=after_step,
                prefix=prepared.prefix,
            )
            for skill in prepared.finish:
                skills[skill.name] = _skill_phase(skill, prepared, recipe, rng, progress, started)
            if prepared.finish:
                report = prepared.evaluate()
                if progress:
                    phases = ", ".join(skill.name for skill in prepared.finish)
                    print(f"after {phases}: val greedy: {_scores(report)}", flush=True)
            prepared.model.save_pretrained(str(tmp))
            prepared.tokenizer.save_pretrained(str(tmp))
            manifest = {
                "name": recipe.name,
                "format": recipe.build_format,
                "seed": seed,
                "steps": steps,
                "habit_rate": recipe.habit_rate,
                **prepared.manifest,
                **({"skills": skills} if skills else {}),
                **{f"val_greedy_{k}": round(v, 3) for k, v in report.items()},
                "build_seconds": round(time.monotonic() - started, 1),
            }
            (tmp / "agentgrad_build.json").write_text(json.dumps(manifest, indent=2) + "\n")
    finally:
        torch.set_num_threads(previous_threads)
    return out


def _scores(report: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in report.items())


def _skill_phase(
    skill: Skill, prepared: Prepared, recipe: Recipe, rng: random.Random, progress: bool, started: float
) -> dict[str, Any]:
    """Run one skill phase (see :class:`Skill`); its steps and last probe go in the manifest."""
    import time

    score = 0.0

    def after_step(step: int, loss: float) -> bool:
        nonlocal score
        elapsed = f"({time.monotonic() - started:.0f}s)"
        if step % skill.probe_every:
            if progress and step % 50 == 0:
                print(f"{skill.name} step {step:4d}  loss {loss:.3f}  {elapsed}", flush=True)
            return False
        score = skill.probe()
        if progress:
            print(f"{skill.name} step {step:4d}  loss {loss:.3f}  probe {score:.2f}  {elapsed}", flush=True)
        return skill.threshold is not None and score >= skill.threshold

    steps = warm_up(
        prepared.model,
        skill.samples,
        steps=skill.max_steps,
        batch_size=recipe.batch_size,
        peak_lr=recipe.peak_lr if skill.peak_lr is None else skill.peak_lr,
        habit_rate=skill.habit_rate,
        pad=prepared.tokenizer.pad_token_id,
        rng=rng,
        after_step=after_step,
        prefix=prepared.prefix,
        decay=skill.decay,
    )
    return {"steps": steps, "probe": round(score, 3)}
