"""Engine throughput: 1, 4, 16 and 64 concurrent requests against sequential ``generate``.

Prints one JSON object. The baseline is Hugging Face ``model.generate`` called once per request
(batch 1, KV cache), which is what a naive server does; the engine runs the same requests
concurrently through its continuous-batching loop. Uses a random-initialised tiny model (the
speed does not depend on the weights) unless --model points at a model directory.

    python bench/bench_engine.py [--model DIR] [--requests 64] [--max-tokens 64] [--concurrency 1,4,16,64]

With many requests in flight the batch's key-value cache is what a decode step moves: it grows in
place (``agentgrad.inference.batch_cache``), so its cost is the attention reading it, not a copy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4,16,64", help="comma-separated requests in flight")
    args = parser.parse_args()

    import torch

    from agentgrad.demo import calc
    from agentgrad.demo.tiny import random_tiny_model
    from agentgrad.inference import Engine, SamplingParams

    model_dir = args.model or random_tiny_model(tempfile.mkdtemp(prefix="bench-tiny-"))
    levels = [int(c) for c in args.concurrency.split(",")]
    engine = Engine(model_dir, max_batch_size=max(levels))
    tok = engine.tokenizer
    problems = calc.generate_problems(args.requests, seed=0, split="test")
    prompts = [calc.prompt_ids(tok, p["question"]) for p in problems]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True, seed=0)
    total = args.requests * args.max_tokens

    engine.generate(prompts[0], params)  # warm-up
    started = time.perf_counter()
    with torch.inference_mode():
        for p in prompts:
            engine._base.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=args.max_tokens,
                min_new_tokens=args.max_tokens,
                do_sample=True,
                pad_token_id=tok.pad_token_id,
            )
    sequential = total / (time.perf_counter() - started)

    report = {
        "model": str(model_dir) if args.model else "random tiny (0.87M params)",
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "prompt_tokens": len(prompts[0]),
        "torch_threads": torch.get_num_threads(),
        "sequential_generate_tok_s": round(sequential, 1),
    }
    for concurrency in levels:
        engine.max_batch_size = concurrency  # at most `concurrency` requests in flight
        steps = engine.forward_steps
        started = time.perf_counter()
        futures = [engine.submit(p, params) for p in prompts]
        for f in futures:
            f.result()
        rate = total / (time.perf_counter() - started)
        report[f"engine_c{concurrency}_tok_s"] = round(rate, 1)
        report[f"engine_c{concurrency}_speedup"] = round(rate / sequential, 2)
        report[f"engine_c{concurrency}_forward_passes"] = engine.forward_steps - steps
    engine.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
