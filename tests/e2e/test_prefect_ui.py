"""The Prefect web UI, driven in headless Chromium the way a person uses it: custom run of a served deployment.

A stand-in flow with the pipeline's parameter types (`stages: list[Literal[...]]`, `preset: str | None`,
`overrides: dict | None`) is served with `flow.serve` against a real Prefect server with its UI on. Playwright
opens the deployment page, clicks Run > Custom run, picks a stage in the multi-select, types a preset and a JSON
override, submits, opens the new flow run, waits for "Completed" and follows the Artifacts tab to the markdown
artifact's MLflow link. To point it at the real deployment, change the constants below and the serve command.

Screenshots go to $ASP_UI_SCREENSHOT_DIR when set (e.g. docs/img), else to the test's tmp dir;
`flow-run.png` is the completed flow-run page. Chromium: /usr/bin/chromium (`make browser`), or $ASP_CHROMIUM.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
expect = sync_api.expect

CHROMIUM = os.environ.get("ASP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# What the UI is pointed at: change these for the real `asp serve` deployment.
FLOW = "asp-pipeline"
DEPLOYMENT = "asp-pipeline"
STAGE = "schedule"  # picked in the `stages` multi-select
PRESET = "demo"  # typed into the `preset` field (str | None)
OVERRIDES = {"schedule.k": 3}  # typed as JSON into the `overrides` field (dict | None)
MARKDOWN_ARTIFACT = "mlflow-run"  # key of the markdown artifact holding the link
LINK_TEXT = "MLflow run"
LINK_URL = "http://127.0.0.1:5000/#/experiments/1/runs/abc"

STANDIN = f'''
import json
from typing import Any, Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact


@flow(name={FLOW!r})
def pipeline(
    stages: list[Literal["prepare", "schedule", "launch"]],
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[str]:
    """Stand-in for asp.orchestrate: the same parameter types and the same kinds of artifacts."""
    create_markdown_artifact(key={MARKDOWN_ARTIFACT!r}, markdown="## Pipeline\\n\\n[{LINK_TEXT}]({LINK_URL})")
    create_table_artifact(
        key="stage-summary",
        table=[{{"stage": s, "preset": preset or "", "overrides": json.dumps(overrides or {{}})}} for s in stages],
    )
    return list(stages)


if __name__ == "__main__":
    pipeline.serve(name={DEPLOYMENT!r})
'''

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM} (run `make browser`)"),
]


def _api(env: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        env["PREFECT_API_URL"] + path, data=data, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def _field(page: Any, name: str) -> Any:
    """The schema-form property whose label is `name` (optional ones read "name (Optional)")."""
    label = page.locator(".schema-form-property__label", has_text=re.compile(rf"^{re.escape(name)}( \(Optional\))?$"))
    return page.locator(".schema-form-property").filter(has=label)


def test_custom_run_from_the_ui(tmp_path: Path, prefect_ui_server: dict[str, str], background) -> None:
    env = prefect_ui_server
    ui = env["PREFECT_UI_URL"]
    shots = Path(os.environ.get("ASP_UI_SCREENSHOT_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    (tmp_path / "standin.py").write_text(STANDIN)
    # The runner polls for scheduled runs every PREFECT_RUNNER_POLL_FREQUENCY s (default 10).
    serve_env = dict(env, PREFECT_RUNNER_POLL_FREQUENCY="2")
    serve = background.start([sys.executable, "standin.py"], log=tmp_path / "serve.log", env=serve_env, cwd=tmp_path)
    name = urllib.parse.quote(f"{FLOW}/{DEPLOYMENT}")
    deployment = json.loads(background.wait_http(f"{env['PREFECT_API_URL']}/deployments/name/{name}", serve, 120))

    api_errors: list[str] = []  # failed API calls the page made: the UI only says "Something went wrong"
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(30_000)

        def note_api_error(r: Any) -> None:
            if r.status >= 400 and "/api/" in r.url:
                try:
                    body = r.text()[:500]
                except Exception as exc:  # the body may be gone already
                    body = repr(exc)
                api_errors.append(f"{r.status} {r.request.method} {r.url} {r.request.post_data} -> {body}")

        page.on("response", note_api_error)
        try:
            # Deployment page > Run > Custom run.
            page.goto(f"{ui}/deployments/deployment/{deployment['id']}")
            expect(page.get_by_text("Ready", exact=True)).to_be_visible()
            page.screenshot(path=shots / "deployment.png")
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Custom run", exact=True).click()
            expect(page.get_by_role("heading", name="Parameters")).to_be_visible()

            # stages: a multi-select of the Literal's values. A click on the field's text opens and at once closes
            # the list (the click toggles it twice); ArrowDown on the focused field opens it.
            stages = _field(page, "stages")
            stages.get_by_role("button", name="No items selected").click()
            options = page.get_by_role("listbox")
            if not options.is_visible():
                page.keyboard.press("ArrowDown")
            options.get_by_role("option", name=STAGE, exact=True).click()
            page.get_by_role("heading", name="Parameters").click()  # click outside closes it (Escape does not)
            expect(options).to_be_hidden()
            expect(stages).to_contain_text(STAGE)

            # preset (str | None): a "str | None" toggle, None selected; "str" shows a text box.
            preset = _field(page, "preset")
            preset.get_by_role("button", name="str", exact=True).click()
            preset.get_by_role("textbox").fill(PRESET)

            # overrides (dict | None): "dict" swaps the toggle for a JSON code editor holding `null`.
            overrides = _field(page, "overrides")
            overrides.get_by_role("button", name="dict", exact=True).click()
            editor = overrides.get_by_role("textbox")
            editor.click()
            page.keyboard.press("ControlOrMeta+a")
            editor.fill(json.dumps(OVERRIDES))
            expect(overrides).to_contain_text(json.dumps(OVERRIDES))

            run_name = page.locator(".p-label", has_text="Run Name").get_by_role("textbox").input_value()
            page.screenshot(path=shots / "custom-run.png", full_page=True)
            page.get_by_role("button", name="Submit", exact=True).click()

            # Back on the deployment page; its Runs list links the new run by name.
            page.get_by_role("link", name=run_name, exact=True).first.click()
            page.wait_for_url(re.compile(r"/runs/flow-run/"))
            state = page.get_by_role("banner").get_by_text("Completed", exact=True)
            expect(state).to_be_visible(timeout=90_000)
            expect(page.get_by_text("Finished in state Completed()")).to_be_visible()  # the Logs tab
            page.screenshot(path=shots / "flow-run.png")

            # Artifacts tab: one card per artifact; the markdown renders on the artifact's own page.
            page.get_by_role("tablist").get_by_text("Artifacts", exact=True).click()
            cards = page.get_by_role("tabpanel", name="Artifacts")
            expect(cards.get_by_role("link", name=re.compile("stage-summary"))).to_be_visible()
            page.screenshot(path=shots / "artifacts.png")
            cards.get_by_role("link", name=re.compile(MARKDOWN_ARTIFACT)).click()
            link = page.get_by_role("link", name=LINK_TEXT, exact=True)
            expect(link).to_be_visible()
            expect(link).to_have_attribute("href", LINK_URL)
            page.screenshot(path=shots / "mlflow-artifact.png")
        except Exception:
            page.screenshot(path=shots / "failure.png", full_page=True)
            print(f"API errors seen by the page: {api_errors}\nserve log:\n{background.log(serve)}")
            raise
        finally:
            browser.close()

    runs = _api(env, "/flow_runs/filter", {"flow_runs": {"name": {"any_": [run_name]}}})
    assert [r["parameters"] for r in runs] == [{"stages": [STAGE], "preset": PRESET, "overrides": OVERRIDES}]
    assert runs[0]["state_type"] == "COMPLETED"
    print(f"UI test took {time.monotonic() - started:.1f} s (after the server was up); screenshots in {shots}")
