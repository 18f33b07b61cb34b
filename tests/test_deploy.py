"""The deployment files (Dockerfile, deploy/compose.yaml, deploy/k8s/) are valid and cannot rot.

* Every Kubernetes manifest validates, strictly (no unknown field), against the Kubernetes JSON
  schemas that ``kubernetes-validate`` ships in its wheel (offline), for the oldest release the
  manifests need (1.29: the trainer's model server is a native sidecar) and the newest it knows.
* ``compose.yaml`` validates against the Compose specification's schema (the copy vendored in
  ``check-jsonschema``, offline), and with ``docker compose config`` where Docker Compose exists.
* Every command in them is a real ``agentgrad`` command line: parsed by the CLI's own argparse
  parser, its agent loadable and its task files readable, so renaming a flag breaks this test.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
#: Where the image puts deploy/tasks/ (the Dockerfile's `COPY deploy/tasks ./tasks`).
IMAGE_TASKS = "/opt/agentgrad/tasks/"
#: Every process of the distributed shape, in both compose.yaml and the Kubernetes manifests.
COMPONENTS = {("store", "serve"), ("dashboard",), ("serve-model",), ("proxy",), ("runner",), ("train",)}
#: Made-up secrets for `docker compose config` (compose.yaml refuses to render without them).
ENV = {
    "POSTGRES_PASSWORD": "pw",
    "AGENTGRAD_STORE_TOKEN": "s",
    "AGENTGRAD_PROXY_TOKEN": "p",
    "AGENTGRAD_MODEL_TOKEN": "m",
}


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    """(``file: Kind/name``, document) for every document of every manifest file."""
    docs = []
    for path in _manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}: {doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def _k8s_containers() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for where, doc in _manifests():
        spec = _pod_spec(doc)
        for container in [*(spec or {}).get("initContainers", []), *(spec or {}).get("containers", [])]:
            found.append((f"{where} container {container['name']}", container))
    return found


def _commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, argv, environment variable names → source) of every AgentGrad process."""
    found = []
    for name, service in _compose()["services"].items():
        if "command" in service and service["command"][0] == "agentgrad":
            found.append((f"compose.yaml: {name}", service["command"], service.get("environment", {})))
    for where, container in _k8s_containers():
        if container["image"].startswith("agentgrad"):
            env = {e["name"]: e.get("value") or str(e.get("valueFrom")) for e in container.get("env", [])}
            found.append((where, container["command"], env))
    return found


# ---- Kubernetes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_every_kubernetes_manifest_validates_strictly_against_the_schemas(version: str) -> None:
    import kubernetes_validate

    version = kubernetes_validate.latest_version() if version == "latest" else version
    docs = _manifests()
    assert {doc["kind"] for _, doc in docs} >= {"Namespace", "Secret", "Deployment", "Service", "StatefulSet", "Job"}
    errors = []
    for where, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert not errors, "\n".join(errors)


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The check above can fail: a misspelt field and a wrong type are caught."""
    import kubernetes_validate

    _, deployment = next((w, d) for w, d in _manifests() if d["kind"] == "Deployment")
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["replica"] = 2
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["command"] = "agentgrad runner"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_kustomization_lists_every_manifest_and_everything_is_in_one_namespace() -> None:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == [p.name for p in _manifest_files()]
    assert listed[0] == "namespace.yaml"  # applied first
    namespaced = [(w, d) for w, d in _manifests() if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for _, d in namespaced} == {"agentgrad"}


def test_kubectl_kustomize_renders_every_manifest() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed here (`kubectl kustomize deploy/k8s` renders the set where it is)")
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered.stdout) if d)
    assert kinds == sorted((d["kind"], d["metadata"]["name"]) for _, d in _manifests())


def test_every_service_selects_a_pod_with_the_port_it_targets() -> None:
    docs = [d for _, d in _manifests()]
    pods = [(d["spec"]["template"]["metadata"]["labels"], _pod_spec(d)) for d in docs if _pod_spec(d)]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        matching = [spec for labels, spec in pods if selector.items() <= labels.items()]
        assert matching, f"Service {service['metadata']['name']} selects no pod"
        ports = {
            p.get("name")
            for spec in matching
            for c in [*spec.get("initContainers", []), *spec["containers"]]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {service['metadata']['name']}: no port {port['targetPort']}"


def test_every_secret_reference_names_a_key_of_the_secret() -> None:
    secrets = {d["metadata"]["name"]: set(d["stringData"]) for _, d in _manifests() if d["kind"] == "Secret"}
    for where, container in _k8s_containers():
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets.get(ref["name"], set()), f"{where}: {env['name']} names {ref}"


def test_pods_of_the_image_run_as_its_non_root_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile).group(1))
    assert re.search(r"^USER agentgrad$", dockerfile, re.M)
    for where, doc in _manifests():
        spec = _pod_spec(doc)
        if spec and any(c["image"].startswith("agentgrad") for c in spec["containers"]):
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            assert spec["securityContext"]["runAsUser"] == uid, where


# ---- Compose ----------------------------------------------------------------------------------------
def test_compose_file_validates_against_the_compose_specification() -> None:
    import jsonschema

    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(_compose())]
    assert not errors, "\n".join(errors)
    bad = _compose()
    bad["services"]["runner"]["depends_on"] = {"store": {"condition": "service_happy"}}
    assert any(True for _ in validator.iter_errors(bad))  # the schema does catch mistakes


def _docker_compose() -> list[str] | None:
    """The Docker Compose command line on this machine, or None."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def test_docker_compose_config_accepts_the_file() -> None:
    compose = _docker_compose()
    if compose is None:
        pytest.skip("Docker Compose is not installed here (`docker compose config` validates where it is)")
    env = {**os.environ, **ENV}
    rendered = subprocess.run(
        [*compose, "-f", str(COMPOSE), "config", "--format", "json"], capture_output=True, text=True, env=env
    )
    assert rendered.returncode == 0, rendered.stderr
    services = json.loads(rendered.stdout)["services"]
    assert services["store"]["environment"]["AGENTGRAD_STORE_TOKEN"] == "s"
    missing = subprocess.run(
        [*compose, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "AGENTGRAD_STORE_TOKEN"},
    )
    assert missing.returncode != 0 and "AGENTGRAD_STORE_TOKEN" in missing.stderr  # no default secret


def test_compose_services_of_the_image_are_built_from_this_repository() -> None:
    for name, service in _compose()["services"].items():
        if service.get("image", "").startswith("${AGENTGRAD_IMAGE"):
            assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name


# ---- the commands -----------------------------------------------------------------------------------
def _parse(where: str, argv: list[str]) -> Any:
    from agentgrad.cli import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{' '.join(argv)}` is not a valid agentgrad command line:\n{stderr.getvalue()}")
    assert getattr(args, "func", None), f"{where}: `{' '.join(argv)}` names no command"
    return args


def test_every_command_is_a_real_agentgrad_command_line() -> None:
    commands = _commands()
    for source in ("compose.yaml", "trainer.yaml"):
        assert any(where.startswith(source) for where, _, _ in commands), f"no agentgrad command in {source}"
    seen: dict[str, set[tuple[str, ...]]] = {"compose": set(), "k8s": set()}
    for where, argv, _ in commands:
        assert argv[0] == "agentgrad", where
        _parse(where, argv)
        words = tuple(w for w in argv[1:3] if not w.startswith("-") and not re.match(r"[\w.]+:\w+$", w))
        component = next(c for c in COMPONENTS if words[: len(c)] == c)
        seen["compose" if where.startswith("compose") else "k8s"].add(component)
    assert seen["compose"] == COMPONENTS and seen["k8s"] == COMPONENTS


def test_the_parser_check_can_fail() -> None:
    with pytest.raises(pytest.fail.Exception, match="--no-such-flag"):
        _parse("here", ["agentgrad", "runner", "m:a", "--store", "x", "--no-such-flag"])
    with pytest.raises(pytest.fail.Exception, match="invalid choice"):
        _parse("here", ["agentgrad", "stor", "serve"])


def test_agents_load_and_task_files_exist_in_the_image() -> None:
    from agentgrad.agents import Agent, load_agent
    from agentgrad.demo.calc import generate_problems
    from agentgrad.tasks import read_tasks

    for where, argv, _ in _commands():
        args = _parse(where, argv)
        if getattr(args, "agent", None):
            assert isinstance(load_agent(args.agent), Agent), where
        for flag in ("tasks", "val"):
            path = getattr(args, flag, None)
            if path:
                assert path.startswith(IMAGE_TASKS), f"{where}: --{flag} {path} is not a file of the image"
                assert read_tasks(DEPLOY / "tasks" / path.removeprefix(IMAGE_TASKS)), where
    # The shipped task files are the calculator demo's own splits (train and val never overlap).
    assert read_tasks(DEPLOY / "tasks" / "calc-train.jsonl") == generate_problems(256, 0, "train")
    assert read_tasks(DEPLOY / "tasks" / "calc-val.jsonl") == generate_problems(32, 0, "val")


def test_every_process_gets_the_tokens_of_the_servers_it_talks_to() -> None:
    """A runner without the proxy token, or a trainer without the store's, fails only at run time."""
    from agentgrad.http.guard import MODEL_TOKEN_ENV, PROXY_TOKEN_ENV
    from agentgrad.store import TOKEN_ENV

    for where, argv, env in _commands():
        args = _parse(where, argv)
        line = " ".join(argv)
        if "store" in line.split()[:3] or "http://store:" in line:
            assert TOKEN_ENV in env, f"{where}: no {TOKEN_ENV}"
        if getattr(args, "proxy", None) or args.func.__name__.endswith("proxy"):
            assert PROXY_TOKEN_ENV in env, f"{where}: no {PROXY_TOKEN_ENV}"
        if "serve-model" in argv or getattr(args, "upstream", None):
            assert MODEL_TOKEN_ENV in env, f"{where}: no {MODEL_TOKEN_ENV}"


# ---- the distributed shape, run here ----------------------------------------------------------------
def _local(argv: list[str], ports: dict[str, int], work: Path, backend: str) -> list[str]:
    """A compose command line as it runs on this machine: services on 127.0.0.1 at free ports,
    the image's paths under ``work``, the store over this machine's PostgreSQL."""
    out = []
    for arg in argv:
        arg = re.sub(r"http://(store|model|proxy):\d+", lambda m: f"http://127.0.0.1:{ports[m.group(1)]}", arg)
        arg = re.sub(r"^postgresql://\S+$", backend, arg)
        arg = arg.replace(IMAGE_TASKS, f"{work}/tasks/").replace("/runs/", f"{work}/runs/")
        out.append("127.0.0.1" if arg == "0.0.0.0" else arg)
    if "--port" in out:
        name = {"store": "store", "dashboard": "dashboard", "serve-model": "model", "proxy": "proxy"}[out[1]]
        out[out.index("--port") + 1] = str(ports[name])
    return out


@pytest.mark.slow
@pytest.mark.tiny_model
@pytest.mark.timeout(1500)
def test_the_compose_shape_trains_on_this_machine(tmp_path: Path) -> None:
    """Without a Docker engine, the next best smoke test: compose.yaml's own command lines, as
    processes here (PostgreSQL, store service, dashboard, model server, proxy, two runners, a GRPO
    trainer cut to one step), train and publish new weights to the separate model server."""
    import httpx
    from chaos_processes import child_env, free_port
    from service_backends import PG_URL, skip_unless_ci

    from agentgrad.store.client import StoreClient

    try:
        import psycopg

        psycopg.connect(PG_URL, connect_timeout=2).close()
    except Exception as exc:  # noqa: BLE001 - any reason PostgreSQL cannot be reached
        skip_unless_ci(f"no PostgreSQL at {PG_URL}: {exc}")
    schema = f"agtest_deploy_{os.getpid()}"
    ports = {name: free_port() for name in ("store", "dashboard", "model", "proxy")}
    (tmp_path / "tasks").mkdir()
    shutil.copy(DEPLOY / "tasks" / "calc-train.jsonl", tmp_path / "tasks")
    val = (DEPLOY / "tasks" / "calc-val.jsonl").read_text().splitlines()[:4]  # a short validation
    (tmp_path / "tasks" / "calc-val.jsonl").write_text("\n".join(val) + "\n")
    env = {**child_env(), **ENV, "OMP_NUM_THREADS": "1"}
    services = _compose()["services"]
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        argv = _local(services[name]["command"], ports, tmp_path, f"{PG_URL}?schema={schema}") + list(extra)
        argv[:1] = [sys.executable, "-m", "agentgrad"]  # this checkout's, not whichever is on PATH
        with open(tmp_path / f"{name}-{len(procs)}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    def healthy(name: str) -> None:
        path = "/dashboard/" if name == "dashboard" else "/health"  # the dashboard has no /health: any answer
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{ports[name]}{path}", timeout=2).status_code < 500:
                    return
            assert procs[-1].poll() is None, (tmp_path / f"{name}-{len(procs) - 1}.log").read_text()
            time.sleep(0.5)
        pytest.fail(f"{name} did not become healthy")

    try:
        for name in ("store", "model", "proxy", "dashboard"):
            start(name)
            healthy(name)
        runners = [start("runner") for _ in range(2)]
        trainer = start("trainer", ("--steps", "1", "--batch-size", "2", "--group-size", "2", "--val-every", "0"))
        assert trainer.wait(timeout=900) == 0, (tmp_path / f"trainer-{len(procs) - 1}.log").read_text()[-4000:]
        assert all(r.poll() is None for r in runners)  # still serving
        summary = json.loads((tmp_path / "runs" / "grpo" / "summary.json").read_text())
        assert summary["steps"] == 1
        assert list((tmp_path / "runs" / "grpo" / "published").iterdir())  # weights went to the server
        store = StoreClient(f"http://127.0.0.1:{ports['store']}", token=ENV["AGENTGRAD_STORE_TOKEN"])
        try:
            rollouts = store.query_rollouts()
        finally:
            store.close()
        assert len(rollouts) >= 2 * 2 + 2 * 4  # one step's group of rollouts, two validations
        page = httpx.get(
            f"http://127.0.0.1:{ports['dashboard']}/dashboard/",
            params={"token": ENV["AGENTGRAD_STORE_TOKEN"]},
            timeout=10,
            follow_redirects=True,
        )
        assert page.status_code == 200
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
