"""`asp ui prefect`'s server runs an API request again when Prefect answered it 503 (its SQLite database busy), so
the web UI, which does not retry, gets the answer: checked on a FastAPI app built like Prefect's (the API mounted
at /api, an exception handler answering 503 and Starlette re-raising after it), in process, without a server.
`asp ui prefect` and the tests' Prefect servers (tests/conftest.py) run Prefect's own server inside `RetryBusy`.

    .venv/bin/python -m pytest tests/test_prefect_server_retry.py -q          (about 2 s)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asp.cli.prefect_server import RetryBusy


class Busy(Exception):
    """Stands for sqlite3's SQLITE_BUSY inside SQLAlchemy's OperationalError (Prefect answers it 503)."""


def prefect_like_app(busy_times: int, bodies: list[bytes]) -> FastAPI:
    """An app shaped like Prefect's: the API mounted at /api, whose `create_flow_run` is refused as busy
    `busy_times` times (503 from an exception handler, as Prefect's `custom_internal_exception_handler`)."""
    api = FastAPI()
    calls = {"n": 0}

    @api.post("/deployments/{deployment_id}/create_flow_run", status_code=201)
    async def create_flow_run(deployment_id: str, request: Request) -> dict[str, Any]:
        bodies.append(await request.body())
        calls["n"] += 1
        if calls["n"] <= busy_times:
            raise Busy("database is locked")
        return {"id": f"run-{calls['n']}", "deployment_id": deployment_id}

    async def busy_handler(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"exception_message": "Service Unavailable"}, status_code=503)

    @api.get("/ready")
    async def ready() -> JSONResponse:  # a plain 503, no exception: not a busy database
        return JSONResponse({"message": "not ready"}, status_code=503)

    api.add_exception_handler(Exception, busy_handler)  # Starlette answers, then re-raises it
    app = FastAPI()
    app.mount("/api", api)
    return app


def _post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # as uvicorn: logged, answer sent
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def test_a_busy_answer_is_retried_with_the_same_body() -> None:
    bodies: list[bytes] = []
    app = RetryBusy(prefect_like_app(busy_times=3, bodies=bodies), first_pause_s=0.001)
    resp = _post(app, "/api/deployments/d1/create_flow_run", {"parameters": {"stages": ["schedule"]}})
    assert resp.status_code == 201 and resp.json() == {"id": "run-4", "deployment_id": "d1"}
    assert app.retried == 3
    assert [json.loads(b) for b in bodies] == [{"parameters": {"stages": ["schedule"]}}] * 4


def test_the_last_busy_answer_goes_through() -> None:
    bodies: list[bytes] = []
    app = RetryBusy(prefect_like_app(busy_times=99, bodies=bodies), attempts=3, first_pause_s=0.001)
    resp = _post(app, "/api/deployments/d1/create_flow_run", {})
    assert resp.status_code == 503 and resp.json() == {"exception_message": "Service Unavailable"}
    assert len(bodies) == 3 and app.retried == 2


def test_other_answers_and_paths_are_not_retried() -> None:
    bodies: list[bytes] = []
    app = RetryBusy(prefect_like_app(busy_times=0, bodies=bodies), first_pause_s=0.001)
    assert _post(app, "/api/deployments/d1/create_flow_run", {}).status_code == 201
    assert _post(app, "/api/no/such/endpoint", {}).status_code == 404
    assert _post(app, "/deployments/d1/create_flow_run", {}).status_code == 404  # not under /api: passed through
    assert app.retried == 0 and len(bodies) == 1

    async def get_ready() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/api/ready")

    resp = asyncio.run(get_ready())
    assert resp.status_code == 503 and resp.json() == {"message": "not ready"} and app.retried == 0
