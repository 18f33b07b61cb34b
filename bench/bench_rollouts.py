"""Rollout throughput: the framework's own cost per rollout, end to end (issue 24).

Prints JSON. The workload: N tasks (default 200) in an SQLite store; an agent that makes 3 chat
calls through the capture proxy (:class:`~agentgrad.proxy.LLMProxy`, in this process, writing
into the same store) to :class:`agentgrad.testing.stub.StubUpstream` — a *fake upstream that
answers at once* (a scripted stand-in, not a model; it runs in a process of its own, as an
inference server would) — and returns a reward. Runners take the tasks from the store, as
``Trainer`` runs them.

Configurations (``--configs``; default: all):

* ``inproc-R``: R runners (R = 1, 2, 4) in this process, each on its own thread, as
  ``Trainer(n_runners=1)`` runs one; the sync agent, concurrency 1;
* ``pool-R``: a :class:`~agentgrad.runner.RunnerPool` of R runner processes (forked from a fork
  server, opening the store by URL), as ``Trainer(n_runners=R)`` starts them; the sync agent,
  concurrency 1. The fork server is started before the first configuration, off the clock
  (``RunnerPool.prepare()``, which ``Trainer`` calls before it loads its model); ``--cold-start``
  leaves it to the first pool, on the clock (~0.4 s), as a script that starts a pool first thing;
* ``async-C``: one in-process runner with C concurrent slots (C = 1, 4, 8) and an async agent;
* ``async-proc-C``: the same runner in a process of its own (a ``RunnerPool`` of one), as
  ``Trainer(n_runners=1, concurrency=C)`` starts it: the agent and the runner on one GIL, the
  proxy and the store on the trainer's.

Per configuration:

* ``rollouts_per_s``: N over the wall time from starting the runners (start-up included) to the
  last rollout done;
* ``overhead_ms_per_rollout``: (wall × slots − the agent's own time) / N, where slots = runners ×
  concurrency and the agent's own time is measured inside the agent (its 3 calls through the
  proxy included): the time a slot spent on anything but the agent; ``steady_*`` the same
  without start-up (from the first agent start to the last agent end);
* ``agent_ms_per_rollout``: the agent's own time per rollout;
* ``cpu_ms_per_rollout``: CPU per rollout of this process (store, proxy, in-process runners), of
  each runner process (``runner_process``, their mean, start-up included), and of the stub;
* ``agent_client``: the async agent's HTTP client (``--clients``: ``httpx``, which the OpenAI SDK
  calls through, or ``aiohttp``); and once per run, ``agent_client_cpu_ms_per_request``: each
  client's own CPU per request, measured alone against the stub. With an upstream that answers at
  once, an async runner's slots can only overlap the wait for the proxy and the stub, while its
  one interpreter spends the agent's client CPU and the framework's on every rollout: the async
  speed-up is bounded by (CPU + wait) / CPU of that process, which the client's cost decides;
* ``startup_s``: from starting the runners to each one's first agent call (max and median);
* ``captured_llm_calls``: LLM-call spans the store counted; a run with fewer than 3 × N, or with
  a rollout that did not succeed, is marked ``"valid": false``.

``--store service`` puts the SQLite file behind ``agentgrad store serve`` in a process of its
own, as several machines share a store: the proxy, the runners and the trainer reach it over HTTP
(a :class:`~agentgrad.store.client.StoreClient`), and the service's CPU is ``store_service``;
``--store-delay SECONDS`` puts a relay in front of it that holds every chunk that long each way, a
stand-in for the network between machines.

Compare two versions of the code by alternating runs on a noisy machine: the first ``PYTHONPATH``
entry is measured when one is set, e.g. ``PYTHONPATH=/tmp/before/src python bench/bench_rollouts.py``.
``--rounds K`` repeats every configuration K times (interleaved).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(REPO / "src"))

from serving import cpu_seconds, start_listening  # noqa: E402 (bench/ is on sys.path)

CALLS_PER_ROLLOUT = 3
CONFIGS = (
    "inproc-1",
    "inproc-2",
    "inproc-4",
    "pool-1",
    "pool-2",
    "pool-4",
    "async-1",
    "async-4",
    "async-8",
    "async-proc-1",
    "async-proc-4",
    "async-proc-8",
)
#: The configurations whose runners are processes (a ``RunnerPool``), forked from the fork server.
IN_PROCESSES = ("pool", "async-proc")
_BODY = {"model": "stub-model", "max_tokens": 8, "temperature": 0}
_SERVE_STUB = """
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
from agentgrad.testing.stub import StubUpstream
stub = StubUpstream(["The answer is 5."])
print(stub.start(), flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
stub.stop()
"""

#: A TCP relay that holds every chunk ``delay`` seconds before passing it on, each way: a stand-in
#: for the network between machines, in front of the store service (``--store-delay``).
_SERVE_RELAY = """
import asyncio, sys
target, delay = int(sys.argv[1]), float(sys.argv[2])

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def handle(client_reader, client_writer):
    reader, writer = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""

# ---- the agent (module level: runner processes import it by reference) -----------------------------
_clients: dict[Any, Any] = {}
_timings: dict[str, Any] = {}  # this process's file of agent timings, by the run's directory


def _record(started: float, ended: float) -> None:
    """Append one rollout's agent time (wall clock, seconds) to this process's timing file."""
    where = os.environ["BENCH_ROLLOUTS_DIR"]
    file = _timings.get(where)
    if file is None:
        file = _timings[where] = open(Path(where) / f"agent-{os.getpid()}.txt", "a", buffering=1)  # noqa: SIM115
    file.write(f"{started!r} {ended!r}\n")


def _messages(task: Any, turn: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"task {task['i']}, step {turn}: what is 2 + 3?"}]


def sync_agent(task: Any, llm: Any) -> float:
    """Three chat calls through the LLM endpoint the runner gave (the proxy), then a reward."""
    import httpx

    started = time.time()
    client = _clients.get("sync")
    if client is None:
        client = _clients["sync"] = httpx.Client(timeout=60)
    for turn in range(CALLS_PER_ROLLOUT):
        response = client.post(llm.endpoint + "/chat/completions", json={**_BODY, "messages": _messages(task, turn)})
        response.raise_for_status()
    _record(started, time.time())
    return 1.0


async def async_agent(task: Any, llm: Any) -> float:
    """:func:`sync_agent` on an async HTTP client (one per event loop): ``httpx.AsyncClient``, the
    client the OpenAI SDK calls through, or ``aiohttp`` (``BENCH_ROLLOUTS_CLIENT``, see ``--clients``)."""
    import asyncio

    started = time.time()
    loop = asyncio.get_running_loop()
    post = _clients.get(loop)
    if post is None:
        post = _clients[loop] = await _async_post(os.environ.get("BENCH_ROLLOUTS_CLIENT", "httpx"))
    for turn in range(CALLS_PER_ROLLOUT):
        await post(llm.endpoint + "/chat/completions", {**_BODY, "messages": _messages(task, turn)})
    _record(started, time.time())
    return 1.0


async def _async_post(client: str) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """``post(url, body)`` on a new async client of the kind named, for the running event loop; it
    raises on an error status and reads the whole answer, as an SDK does. The client is closed
    when the loop shuts down (``asyncio.run`` closes the async generator that holds it)."""
    if client == "httpx":
        import httpx

        session: Any = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=64))

        async def post(url: str, body: dict[str, Any]) -> None:
            (await session.post(url, json=body)).raise_for_status()

        close = session.aclose
    else:
        import aiohttp

        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

        async def post(url: str, body: dict[str, Any]) -> None:
            async with session.post(url, json=body) as response:
                response.raise_for_status()
                await response.read()

        close = session.close

    async def hold() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await close()

    holder = hold()
    await holder.__anext__()  # started: the loop's shutdown now finalizes it
    _clients[("holder", id(holder))] = holder
    return post


def client_cost(upstream: str, client: str, requests: int = 1000) -> float:
    """CPU (ms) one request costs the async ``client`` on its own: ``requests`` chat calls in a row
    straight to the stub, in this process, timed by this thread's CPU clock (the stub answers in
    its own process). What an async agent's runner spends on the agent's HTTP calls, apart from
    the framework."""
    import asyncio

    async def measure() -> float:
        post = await _async_post(client)
        body = {**_BODY, "messages": _messages({"i": 0}, 0)}
        for _ in range(50):  # connect, warm up
            await post(upstream + "/chat/completions", body)
        began = time.thread_time()
        for _ in range(requests):
            await post(upstream + "/chat/completions", body)
        return (time.thread_time() - began) * 1e3 / requests

    return round(asyncio.run(measure()), 3)


# ---- the harness ----------------------------------------------------------------------------------
@contextmanager
def _stub() -> Iterator[tuple[str, int]]:
    """The fake upstream in a process of its own: its OpenAI base URL and pid."""
    process = subprocess.Popen([sys.executable, "-c", _SERVE_STUB], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the stub upstream exited before printing its URL")
        yield line.strip(), process.pid
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def _delayed(url: str, delay: float) -> Iterator[str]:
    """``url`` behind :data:`_SERVE_RELAY` (a process of its own): the relay's URL."""
    port = url.rstrip("/").rsplit(":", 1)[1]
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE_RELAY, port, str(delay)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the relay exited before printing its port")
        yield f"http://127.0.0.1:{line.strip()}"
    finally:
        process.kill()
        process.wait(30)


@contextmanager
def _store_service(db: Path) -> Iterator[tuple[str, int]]:
    """``agentgrad store serve`` over the SQLite file ``db``, in a process of its own: its URL and pid."""
    harness = "import sys\nfrom agentgrad.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    process, url = start_listening(
        [sys.executable, "-c", harness, "store", "serve", "--backend", f"sqlite:///{db}", "--port", "0"]
    )
    try:
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(30)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _parse(config: str) -> tuple[str, int]:
    kind, _, count = config.rpartition("-")
    if kind not in ("inproc", "pool", "async", "async-proc") or not count.isdigit() or int(count) < 1:
        raise SystemExit(f"unknown configuration {config!r} (e.g. {', '.join(CONFIGS)})")
    return kind, int(count)


def run_config(
    config: str,
    n: int,
    upstream: str,
    stub_pid: int,
    timeout: float,
    client: str = "httpx",
    backend: str = "sqlite",
    store_delay: float = 0.0,
) -> dict[str, Any]:
    from agentgrad.agents import rollout
    from agentgrad.proxy.server import LLMProxy
    from agentgrad.runner import Runner, RunnerPool
    from agentgrad.store.client import StoreClient
    from agentgrad.store.protocol import RolloutFilter
    from agentgrad.store.sqlite import SqliteStore
    from agentgrad.types import LLM

    kind, count = _parse(config)
    is_async, in_processes = kind.startswith("async"), kind in IN_PROCESSES
    runners, concurrency = (1, count) if is_async else (count, 1)
    agent = rollout(async_agent if is_async else sync_agent)
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp, contextlib.ExitStack() as service:
        os.environ["BENCH_ROLLOUTS_DIR"] = tmp
        os.environ["BENCH_ROLLOUTS_CLIENT"] = client  # runner processes get this environment
        service_pid = None
        if backend == "service":
            url, service_pid = service.enter_context(_store_service(Path(tmp) / "store.db"))
            if store_delay:
                url = service.enter_context(_delayed(url, store_delay))
            store: Any = StoreClient(url)
        else:
            store = SqliteStore(Path(tmp) / "store.db")
        proxy = LLMProxy(store, upstream)
        proxy.start()
        try:
            # Pinned to a snapshot, as the algorithms enqueue them.
            resources = store.add_resources({"llm": LLM(endpoint=upstream, model="stub-model")})
            requests = [{"input": {"i": i}, "resources_id": resources.resources_id} for i in range(n)]
            ids = [r.rollout_id for r in store.enqueue_rollouts(requests)]
            options: dict[str, Any] = {"concurrency": concurrency, "llm_proxy_url": proxy.url}
            cpu_self, cpu_stub = _cpu(resource.RUSAGE_SELF), cpu_seconds(stub_pid)
            cpu_service = cpu_seconds(service_pid) if service_pid else 0.0
            began = time.time()
            if in_processes:
                pool = RunnerPool(agent, store.shared_url, n_runners=runners, **options).start()
                threads: list[Any] = []
            else:
                workers = [Runner(agent, store, llm_proxy=proxy, **options) for _ in range(runners)]
                threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
                for thread in threads:
                    thread.start()
            done = store.wait_for_rollouts(ids, timeout)
            wall = time.time() - began
            if in_processes:
                # Read before they exit (a fork server's children are not ours to wait for).
                cpu_runners = [cpu_seconds(process.pid) for process in pool.processes]
                pool.stop()
            else:
                for worker in workers:
                    worker.stop()
                for thread in threads:
                    thread.join(30)
            cpu_self = _cpu(resource.RUSAGE_SELF) - cpu_self
            cpu_stub = cpu_seconds(stub_pid) - cpu_stub
            cpu_service = cpu_seconds(service_pid) - cpu_service if service_pid else 0.0
            finished = store.query_rollouts(RolloutFilter(rollout_ids=ids))
        finally:
            proxy.stop()
            store.close()
        spans = [line.split() for path in Path(tmp).glob("agent-*.txt") for line in path.read_text().splitlines()]
        firsts = [float(path.read_text().split()[0]) - began for path in Path(tmp).glob("agent-*.txt")]
    times = [(float(a), float(b)) for a, b in spans]
    agent_total = sum(b - a for a, b in times)
    slots = runners * concurrency
    steady = max(b for _, b in times) - min(a for a, _ in times) if times else float("nan")
    succeeded = sum(r.status.value == "succeeded" for r in finished)
    captured = sum(r.llm_calls for r in finished)

    def ms(seconds: float) -> float:  # per rollout, in ms
        return round(seconds * 1e3 / n, 2)

    return {
        "config": config,
        "runners": runners,
        "concurrency": concurrency,
        "process_pool": in_processes,
        "agent_client": client if is_async else "httpx (sync)",
        "n": n,
        "valid": succeeded == n and captured >= CALLS_PER_ROLLOUT * n and len(done) == n,
        "succeeded": succeeded,
        "captured_llm_calls": captured,
        "wall_s": round(wall, 3),
        "rollouts_per_s": round(n / wall, 1),
        "overhead_ms_per_rollout": ms(wall * slots - agent_total),
        "steady_rollouts_per_s": round(n / steady, 1) if times else None,
        "steady_overhead_ms_per_rollout": ms(steady * slots - agent_total),
        "agent_ms_per_rollout": ms(agent_total),
        "cpu_ms_per_rollout": {
            "this_process": ms(cpu_self),
            "stub": ms(cpu_stub),
            **({"runner_process": ms(statistics.mean(cpu_runners))} if in_processes else {}),
            **({"store_service": ms(cpu_service)} if backend == "service" else {}),
        },
        "startup_s": {"max": round(max(firsts), 3), "median": round(statistics.median(firsts), 3)} if firsts else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="tasks per configuration")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--rounds", type=int, default=1, help="run every configuration this many times, interleaved")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one configuration may take")
    parser.add_argument("--summary", action="store_true", help="print one line of the main figures per run")
    parser.add_argument(
        "--clients",
        default="httpx",
        help="the async agent's HTTP client, comma-separated, each run in turn: httpx (the OpenAI SDK's) "
        "and/or aiohttp (installed separately)",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "service"),
        default="sqlite",
        help="the SQLite file opened by every process, or served by `agentgrad store serve` to all of them",
    )
    parser.add_argument(
        "--store-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --store service: hold every chunk this long each way on its way to and from the store "
        "(a relay standing in for a network between machines)",
    )
    parser.add_argument(
        "--cold-start", action="store_true", help="do not start the runner processes' fork server ahead, off the clock"
    )
    args = parser.parse_args()
    if args.store_delay and args.store != "service":
        raise SystemExit("--store-delay needs --store service")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for config in configs:
        _parse(config)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    for client in clients:
        if client not in ("httpx", "aiohttp"):
            raise SystemExit(f"unknown client {client!r} (httpx, aiohttp)")
    if "aiohttp" in clients:
        try:
            import aiohttp  # noqa: F401
        except ImportError:
            raise SystemExit("--clients aiohttp needs aiohttp: pip install aiohttp") from None
    is_async = {config: _parse(config)[0].startswith("async") for config in configs}
    import agentgrad
    from agentgrad.runner import RunnerPool

    if not args.cold_start and any(_parse(c)[0] in IN_PROCESSES for c in configs):
        RunnerPool.prepare().join()  # as Trainer does while it loads its model

    runs: list[dict[str, Any]] = []
    with _stub() as (upstream, stub_pid):
        costs = {client: client_cost(upstream, client) for client in clients} if any(is_async.values()) else {}
        for round_ in range(args.rounds):
            for config, client in [(c, k) for c in configs for k in (clients if is_async[c] else clients[:1])]:
                result = run_config(
                    config, args.n, upstream, stub_pid, args.timeout, client, args.store, args.store_delay
                )
                result["round"] = round_
                runs.append(result)
                if args.summary:
                    print(
                        json.dumps(
                            {
                                k: result[k]
                                for k in (
                                    "config",
                                    "agent_client",
                                    "round",
                                    "valid",
                                    "rollouts_per_s",
                                    "overhead_ms_per_rollout",
                                    "steady_overhead_ms_per_rollout",
                                    "startup_s",
                                )
                            }
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
    report = {
        "upstream": "agentgrad.testing.stub.StubUpstream (a fake upstream that answers at once; a stand-in, "
        "not a model)",
        "store": "SQLite file (WAL)" if args.store == "sqlite" else "agentgrad store serve over an SQLite file (WAL)",
        "store_delay_s": args.store_delay,
        "fork_server": "started by the first pool, on the clock" if args.cold_start else "started ahead, off the clock",
        "agentgrad": str(Path(agentgrad.__file__).parent),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "agent_client_cpu_ms_per_request": costs,
        "runs": runs,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
