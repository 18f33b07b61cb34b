"""The store service serves the dashboard at ``/`` (composed as ``agentgrad store serve`` does) and keeps
its data behind the token."""

from fastapi.testclient import TestClient

from agentgrad.dashboard.app import dashboard_router
from agentgrad.store.memory import MemoryStore
from agentgrad.store.service.server import create_app


def test_store_service_serves_the_dashboard_behind_its_token() -> None:
    store = MemoryStore(watchdog_interval=None)
    rollout = store.enqueue_rollout({"question": "secret-task-text"})
    client = TestClient(create_app(store, token="s3cret", extra_routers=[dashboard_router(store, "s3cret")]))

    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard/rollouts"
    refused = client.get("/dashboard/rollouts")
    assert refused.status_code == 401 and rollout.rollout_id not in refused.text
    assert client.get("/v1/rollouts/get", params={"rollout_id": rollout.rollout_id}).status_code == 401

    page = client.get("/dashboard/rollouts", headers={"Authorization": "Bearer s3cret"})
    assert page.status_code == 200 and rollout.rollout_id in page.text
    login = client.get("/dashboard/rollouts", params={"token": "s3cret"})  # browser login sets a cookie
    assert login.status_code == 200 and rollout.rollout_id in login.text


def test_the_service_alone_has_no_dashboard() -> None:
    client = TestClient(create_app(MemoryStore(watchdog_interval=None)))
    assert client.get("/dashboard/rollouts").status_code == 404
