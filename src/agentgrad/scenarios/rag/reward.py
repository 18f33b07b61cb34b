"""The RAG scenario's reward: exact match and token F1 after SQuAD's answer normalisation.

The rule of the SQuAD v1.1 evaluation script, which MuSiQue and the reference's RAG example use
too: lower-case, drop punctuation and the articles a/an/the, collapse whitespace; exact match
compares the normalised strings, F1 the bags of their tokens. The agent is asked to wrap its
answer in ``<answer>…</answer>`` (the reference's format); :func:`extract_answer` takes the last
such span, or the whole reply when there is none.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall between the normalised strings."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def extract_answer(reply: str) -> str:
    """The text of the reply's last ``<answer>…</answer>``, else the whole reply."""
    found = _ANSWER_TAG.findall(reply or "")
    return found[-1].strip() if found else (reply or "").strip()


@dataclass(frozen=True)
class Score:
    """Exact match (the reward) and token F1 (reported beside it) of one reply."""

    em: float
    f1: float

    def as_reward(self) -> dict[str, float]:
        """For ``emit_reward(score.as_reward(), primary="em")``: EM trained on, F1 recorded."""
        return {"em": self.em, "f1": self.f1}


def score_reply(reply: str | None, gold: str) -> Score:
    """Score an agent's final reply against the gold answer (an empty reply scores 0)."""
    answer = extract_answer(reply or "")
    return Score(exact_match(answer, gold), token_f1(answer, gold))
