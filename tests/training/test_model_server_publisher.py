"""``ModelServerPublisher`` end to end: a model server started on its own (as ``agentgrad
serve-model`` does), a trainer on the same model that takes an optimizer step, and the served
weights, version and greedy logprobs that follow ``publish``."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgrad.http.transport import request_json  # noqa: E402
from agentgrad.inference import Engine, ModelServer  # noqa: E402
from agentgrad.training import (  # noqa: E402
    ModelServerPublisher,
    PolicyTrainer,
    Published,
    Sample,
    TrainConfig,
)
from agentgrad.training.policy import _layout, token_logprobs  # noqa: E402


@pytest.fixture
def served(tiny_model_dir: Path):
    """A model server over its own engine (nothing shared with the trainer but the directory)."""
    engine = Engine(tiny_model_dir, max_batch_size=4)
    server = ModelServer(engine)
    url = server.start()
    yield engine, url
    server.stop()
    engine.close()


def _greedy(url: str, prompt: list[int]) -> dict:
    reply = request_json(
        "POST",
        f"{url}/completions",
        {
            "model": "m",
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert reply.status == 200, reply.text
    return reply.json()


def _trainer_logprobs(trainer: PolicyTrainer, prompt: list[int], response: list[int]) -> list[float]:
    trainer.model.eval()
    batch = _layout([Sample(prompt, response)], trainer.device)
    with torch.no_grad():
        logprobs, _ = token_logprobs(trainer.model, batch)
    return logprobs[batch.mask.bool()].tolist()


def test_publish_swaps_the_servers_weights(served, tiny_model_dir: Path, tmp_path: Path) -> None:
    engine, url = served
    rng = random.Random(0)
    prompt = [rng.randrange(5, 500) for _ in range(12)]
    before = _greedy(url, prompt)
    assert before["model_version"] == "v0"

    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-2))
    samples = [
        Sample([rng.randrange(5, 500) for _ in range(10)], [rng.randrange(5, 500) for _ in range(10)]) for _ in range(4)
    ]
    trainer.nll_step(samples)
    assert trainer.step == 1
    publisher = ModelServerPublisher(url, tmp_path / "weights")  # the /v1 URL serve-model prints

    published = publisher.publish(trainer)

    # (a) the server reports the new version, and answers with it
    assert published == Published(version="v1")
    after = _greedy(url, prompt)
    assert after["model_version"] == "v1" == engine.model_version
    # (b) the served weights are the trainer's, and so are the greedy completion's logprobs
    served_state = engine._base.state_dict()  # the engine's own model (private: a test looks)
    for name, tensor in trainer.engine_state_dict().items():
        torch.testing.assert_close(served_state[name].cpu(), tensor.cpu(), atol=0, rtol=0, msg=name)
    choice = after["choices"][0]
    ours = _trainer_logprobs(trainer, prompt, choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(ours, abs=1e-4)
    old = _greedy_logprobs_of(before)
    assert old != pytest.approx(_trainer_logprobs(trainer, prompt, before["choices"][0]["token_ids"]), abs=1e-3)

    # old weight directories go: the last two stay
    for _ in range(2):
        trainer.nll_step(samples)
        assert publisher.publish(trainer).version == f"v{trainer.step}"
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]


def _greedy_logprobs_of(reply: dict) -> list[float]:
    return reply["choices"][0]["logprobs"]["token_logprobs"]


def test_errors_name_the_url(served, tiny_model_dir: Path, model_zoo, tmp_path: Path) -> None:
    _engine, url = served
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ConnectionError, match=f"{dead}/v1/update_weights"):
        ModelServerPublisher(dead, tmp_path / "w1", timeout=5).publish(trainer)
    assert not any((tmp_path / "w1").iterdir())  # nothing left behind that nobody serves

    # another model's weights: the server refuses them, and its error body is in the message
    other = PolicyTrainer(model_zoo["llama"], TrainConfig(lr=1e-3))
    with pytest.raises(RuntimeError, match=r"/v1/update_weights refused .* HTTP 400 .*(unknown|shape)") as info:
        ModelServerPublisher(url, tmp_path / "w2", timeout=30).publish(other)
    assert url.removesuffix("/v1") in str(info.value)
    assert _engine.model_version == "v0"  # nothing changed
