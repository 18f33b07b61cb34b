"""GRPO throughput and learning vs TRL's GRPOTrainer on the tiny model (JSON to stdout).

Task (single-turn calculator): the prompt is the system + tools + question turn; the completion
succeeds when it is a well-formed calculator tool call whose expression evaluates to the answer.
Both sides train the same tiny model with the same batch (tasks × group), learning rate,
temperature 1, no KL, max 48 completion tokens, on CPU.

Measured, per side:
* ``optimizer_tokens_per_second``: completion tokens trained per second of optimizer-step time
  (forward + backward + step; generation excluded — TRL's generation is timed separately by
  wrapping ``_generate_and_score_completions``);
* ``greedy_success``: success on 64 held-out questions after ``--seconds`` of wall-clock training.

Usage: ``python bench/bench_grpo_vs_trl.py [--seconds 180] [--model-dir DIR]``. TRL is imported
lazily; without it the TRL side is skipped with a message (``pip install trl``: it is not a
dependency of the project).

Measured on 2 CPU cores (tiny model recipe 3, one torch thread, 180 s per side, 8 tasks × 8):
ours 3,649 optimizer tokens/s and greedy success 0.47 → 1.00; TRL 1.16 695 tokens/s and
0.47 → 0.95 — 5.25× the tokens/s, and no worse success after equal wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentgrad.demo.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, generate_problems, run_calculator
from agentgrad.inference.toolcalls import parse_tool_calls

MAX_NEW = 48


def prompt_text(tokenizer: Any, question: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        tools=[CALCULATOR_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )


def score(completion: str, answer: Any) -> float:
    """1.0 for a parsable calculator call whose expression evaluates to ``answer``."""
    _, calls = parse_tool_calls(completion)
    if not calls:
        return 0.0
    try:
        expression = json.loads(calls[0]["function"]["arguments"]).get("expression", "")
        return 1.0 if run_calculator(str(expression)) == str(answer) else 0.0
    except (ValueError, AttributeError):
        return 0.0


def greedy_success(model: Any, tokenizer: Any, problems: list[dict[str, Any]]) -> float:
    import torch

    tokenizer.padding_side = "left"
    texts = [prompt_text(tokenizer, p["question"]) for p in problems]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    done = [tokenizer.decode(row[enc["input_ids"].shape[1] :], skip_special_tokens=True) for row in out]
    return sum(score(c, p["answer"]) for c, p in zip(done, problems)) / len(problems)


def run_ours(model_dir: Path, train: list[dict], val: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    """Our engine samples; our PolicyTrainer trains; weights are published in-process."""
    import statistics

    from transformers import AutoTokenizer

    from agentgrad.inference import Engine, SamplingParams
    from agentgrad.training import LocalEnginePublisher, PolicyTrainer, Sample, TrainConfig

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    engine = Engine(model_dir, max_batch_size=args.tasks * args.group)
    trainer = PolicyTrainer(model_dir, TrainConfig(lr=args.lr))
    publisher = LocalEnginePublisher(engine)
    started, opt_seconds, opt_tokens, steps, cursor = time.monotonic(), 0.0, 0, 0, 0
    while time.monotonic() - started < args.seconds:
        batch = [train[(cursor + i) % len(train)] for i in range(args.tasks)]
        cursor += args.tasks
        futures = [
            (
                p,
                engine.submit(
                    tokenizer.encode(prompt_text(tokenizer, p["question"]), add_special_tokens=False),
                    SamplingParams(max_tokens=MAX_NEW, temperature=1.0),
                ),
            )
            for p in batch
            for _ in range(args.group)
        ]
        results = [(p, f.result()) for p, f in futures]
        samples = []
        for g in range(args.tasks):
            group = results[g * args.group : (g + 1) * args.group]
            rewards = [score(r.text, p["answer"]) for p, r in group]
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
            # Zero-variance groups stay in (advantage 0), as in TRL, so both sides train the same tokens.
            samples += [
                Sample(r.prompt_token_ids, r.token_ids, None, r.logprobs, (x - mean) / (std + 1e-6))
                for (p, r), x in zip(group, rewards)
            ]
        if samples:
            metrics = trainer.ppo_step(samples)
            opt_seconds += metrics.seconds
            opt_tokens += metrics.tokens
            publisher.publish(trainer)
        steps += 1
    engine.close()
    return {
        "steps": steps,
        "optimizer_seconds": round(opt_seconds, 2),
        "optimizer_tokens": opt_tokens,
        "optimizer_tokens_per_second": round(opt_tokens / max(opt_seconds, 1e-9), 1),
        "greedy_success": greedy_success(trainer.model, tokenizer, val),
    }


def run_trl(model_dir: Path, train: list[dict], val: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    try:
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        return {"skipped": f"TRL not installed ({exc}); pip install trl to compare"}

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    data = Dataset.from_list([{"prompt": prompt_text(tokenizer, p["question"]), "answer": p["answer"]} for p in train])

    def reward(prompts: list[str], completions: list[str], answer: list[Any], **_: Any) -> list[float]:
        return [score(c, a) for c, a in zip(completions, answer)]

    class Budget(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.monotonic()

        def on_step_end(self, args_: Any, state: Any, control: Any, **_: Any) -> Any:
            control.should_training_stop = time.monotonic() - self.started >= args.seconds
            return control

    config = GRPOConfig(
        output_dir=str(args.work_dir / "trl"),
        per_device_train_batch_size=args.tasks * args.group,
        num_generations=args.group,
        max_completion_length=MAX_NEW,
        learning_rate=args.lr,
        beta=0.0,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=100_000,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        adam_beta2=0.99,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Budget()],
    )
    gen = {"seconds": 0.0, "tokens": 0}
    original = trainer._generate_and_score_completions

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = original(*a, **k)
        gen["seconds"] += time.perf_counter() - t0
        gen["tokens"] += int(out["completion_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    opt_seconds = total - gen["seconds"]
    return {
        "steps": trainer.state.global_step,
        "optimizer_seconds": round(opt_seconds, 2),
        "optimizer_tokens": gen["tokens"],
        "optimizer_tokens_per_second": round(gen["tokens"] / max(opt_seconds, 1e-9), 1),
        "greedy_success": greedy_success(trainer.model, tokenizer, val),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180.0, help="wall-clock training budget per side")
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the tiny model (built if missing)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--work-dir", type=Path, default=Path("runs/bench_trl"))
    parser.add_argument("--only", choices=["ours", "trl"], default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model_dir is None:
        from agentgrad.demo.tiny import ensure_tiny_model

        args.model_dir = ensure_tiny_model()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    train, val = generate_problems(2000, 0, "train"), generate_problems(64, 0, "val")
    report: dict[str, Any] = {
        "seconds": args.seconds,
        "tasks": args.tasks,
        "group": args.group,
        "lr": args.lr,
        "torch_threads": torch.get_num_threads(),
    }
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report["initial_greedy_success"] = greedy_success(
        AutoModelForCausalLM.from_pretrained(str(args.model_dir)),
        AutoTokenizer.from_pretrained(str(args.model_dir)),
        val,
    )
    for name, fn in (("ours", run_ours), ("trl", run_trl)):
        if args.only in (None, name):
            with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs: stdout stays pure JSON
                report[name] = fn(args.model_dir, train, val, args)
            print(f"{name}: {report[name]}", file=sys.stderr, flush=True)
    ours, trl = report.get("ours", {}), report.get("trl", {})
    if "optimizer_tokens_per_second" in ours and "optimizer_tokens_per_second" in trl:
        report["tokens_per_second_ratio"] = round(
            ours["optimizer_tokens_per_second"] / max(trl["optimizer_tokens_per_second"], 1e-9), 2
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
