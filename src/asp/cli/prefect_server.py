"""`prefect server start` with the API answering a busy SQLite database itself, not with 503s the UI shows.

    python -m asp.cli.prefect_server server start --host 127.0.0.1 --port 4200   (what `asp ui prefect` runs)

Why: Prefect's embedded SQLite database lets one connection write at a time. A request whose transaction reads
before it writes (the UI's *Run*: `create_flow_run`) is refused at once when another connection wrote meanwhile
(a runner polling, the event persister): SQLite's busy timeout does not apply to that read-to-write upgrade, and
Prefect answers 503 "Service Unavailable", a code its own Python client retries but its web UI does not ("Something
went wrong"). On a loaded machine that is one click in six (benchmarks/prefect_sqlite_load.py).

How: Prefect's own command runs unchanged, with `RetryBusy` around the app it serves. `RetryBusy` runs an API
request again when Prefect's exception handler answered it 503 (Prefect's mark of a retryable database error; the
refused transaction was rolled back), up to `ATTEMPTS` times with a growing pause, as Prefect's own client would;
any other answer (a plain 503 such as /api/ready's too), and the last attempt's, go to the caller as they are.

It also opens Prefect's new web UI at `/` (`NEW_UI_ENV`, unless set): the UI Prefect 3.9 opens, on 3.7 too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

ATTEMPTS = 10  # pauses 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2, 2 s: up to ~9 s of retrying before a 503 gets through
FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 2.0
# Prefect 3.7 serves two web UIs and sends `/` to the old one unless this is set; 3.9 sends it to the new one
# (`/v2/...`). asp's server sets it (unless the user did), so every supported Prefect lands users on the new UI,
# and the links asp prints ask the server which one it opens (`asp.orchestration.serve.prefect_ui_base`).
NEW_UI_ENV = "PREFECT_SERVER_UI_V2_ENABLED"


class RetryBusy:
    """ASGI middleware: an HTTP request under /api that `app` fails with a 503 answer (an exception handled into a
    503, as Prefect's retryable database errors) is run again (its body replayed), up to `attempts` times in all,
    with pauses doubling from `first_pause_s` up to `max_pause_s`. Other requests, websockets and lifespan go
    straight to `app`. `retried` counts the requests run again (for tests)."""

    def __init__(
        self,
        app: ASGIApp,
        attempts: int = ATTEMPTS,
        first_pause_s: float = FIRST_PAUSE_S,
        max_pause_s: float = MAX_PAUSE_S,
    ) -> None:
        self.app = app
        self.attempts = attempts
        self.first_pause_s = first_pause_s
        self.max_pause_s = max_pause_s
        self.retried = 0

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api"):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        pause = self.first_pause_s
        for attempt in range(1, self.attempts + 1):
            if not await self._attempt(scope, bytes(body), receive, send, last=attempt == self.attempts):
                return
            self.retried += 1
            await asyncio.sleep(pause)
            pause = min(2 * pause, self.max_pause_s)

    async def _attempt(
        self, scope: MutableMapping[str, Any], body: bytes, receive: Receive, send: Send, last: bool
    ) -> bool:
        """Run the request once; True when it failed with a 503 answer that was held back (to run it again)."""
        replayed = False
        status: int | None = None
        held: list[Message] = []

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's own disconnect

        async def forward(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            if status == 503 and not last:
                held.append(message)  # sent only if no exception follows (a plain 503, e.g. /api/ready)
            else:
                await send(message)

        try:
            await self.app(dict(scope), replay, forward)  # a copy: routing rewrites the scope (root_path, ...)
        except Exception:
            # Prefect's handler answers 503 for a busy database, then Starlette re-raises the exception: that is
            # the request to run again. Anything else, and the last attempt's, goes on as it came.
            if status != 503 or last:
                raise
            return True
        for message in held:
            await send(message)
        return False


def install() -> None:
    """Make Prefect's `create_app` (what `prefect server start` serves) return its app inside `RetryBusy`."""
    import prefect.server.api.server as server

    create_app = server.create_app
    if getattr(create_app, "_asp_retry_busy", False):
        return

    def create_app_retrying(*args: Any, **kwargs: Any) -> Any:
        return RetryBusy(create_app(*args, **kwargs))

    create_app_retrying._asp_retry_busy = True  # type: ignore[attr-defined]
    server.create_app = create_app_retrying


if __name__ == "__main__":
    import os

    os.environ.setdefault(NEW_UI_ENV, "true")  # the new UI wherever Prefect still defaults to the old one (3.7)
    install()
    from prefect.cli import app

    app()
