"""Optimize ``review_agent``'s prompt with APO against any OpenAI-compatible models.

    python examples/apo/run.py \
        --agent-base-url https://api.openai.com/v1 --agent-model gpt-4o-mini \
        --critic-base-url https://api.openai.com/v1 --critic-model gpt-4o \
        --store apo.db

API keys come from $OPENAI_API_KEY (agent) and $AGENTGRAD_CRITIC_API_KEY (critic and editor;
default $OPENAI_API_KEY). Re-running with the same --store resumes the run. See docs/apo.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # make ``examples`` importable when run as a script

from agentgrad.algorithms.apo import APO, ChatEndpoint  # noqa: E402
from agentgrad.tasks import read_tasks  # noqa: E402
from agentgrad.trainer import Trainer  # noqa: E402
from agentgrad.types import LLM, PromptTemplate  # noqa: E402
from examples.apo.agent import SEED_PROMPT, review_agent  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent-base-url", required=True)
    parser.add_argument("--agent-model", required=True)
    parser.add_argument("--critic-base-url", required=True)
    parser.add_argument("--critic-model", required=True)
    parser.add_argument("--editor-model", help="default: the critic model")
    parser.add_argument("--store", default="apo.db")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    tasks = read_tasks(str(HERE / "tasks.jsonl"))
    critic_key = os.environ.get("AGENTGRAD_CRITIC_API_KEY") or os.environ.get("OPENAI_API_KEY")
    critic = ChatEndpoint(base_url=args.critic_base_url, model=args.critic_model, api_key=critic_key, temperature=0.7)
    editor = ChatEndpoint(
        base_url=args.critic_base_url, model=args.editor_model or args.critic_model, api_key=critic_key, temperature=1.0
    )
    apo = APO(
        critic,
        editor,
        rounds=args.rounds,
        beam_width=2,
        branch_factor=2,
        train_batch_size=8,
        val_batch_size=16,
        run_id="reviews",
    )
    resources = {
        "prompt_template": PromptTemplate(template=SEED_PROMPT),
        "llm": LLM(
            endpoint=args.agent_base_url,
            model=args.agent_model,
            api_key=os.environ.get("OPENAI_API_KEY"),
            sampling={"temperature": 0.0},
        ),
    }
    trainer = Trainer(args.store, concurrency=4, algorithm=apo)
    result = trainer.fit(review_agent, tasks[::2], tasks[1::2] + tasks[::2], resources=resources)
    print(f"score {result.seed.score:.2f} → {result.best.score:.2f}\nbest prompt:\n{result.best.template.template}")


if __name__ == "__main__":
    main()
