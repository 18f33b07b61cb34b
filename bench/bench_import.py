"""`import agentgrad` time in a fresh interpreter (median of several runs). Prints JSON.

    python bench/bench_import.py [--runs 7] [--module agentgrad]

Each run starts a new ``python -c`` and times the import inside it with ``perf_counter``, so
interpreter start-up is excluded; ``-X importtime`` top entries of the last run are included
to show where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--module", default="agentgrad")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    code = f"import time; t = time.perf_counter(); import {args.module}; print(time.perf_counter() - t)"
    times = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip()))
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {args.module}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    rows = []
    for line in trace.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    top = [{"cumulative_ms": round(us / 1000, 1), "module": name} for us, name in sorted(rows, reverse=True)[:8]]
    modules = sorted({name.strip() for _, name in rows})
    print(
        json.dumps(
            {
                "module": args.module,
                "runs": args.runs,
                "median_s": round(statistics.median(times), 4),
                "min_s": round(min(times), 4),
                "max_s": round(max(times), 4),
                "target_s": 0.3,
                "target_met": statistics.median(times) <= 0.3,
                "heavy_modules_loaded": [
                    m
                    for m in ("pydantic", "torch", "transformers", "fastapi", "httpx", "rich", "numpy")
                    if m in modules
                ],
                "top_imports": top,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
