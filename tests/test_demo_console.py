"""``make demo DEMO_ARGS=--console`` as a newcomer meets it, in a real headless Chromium.

The demo runs, prints its report, then leaves the operator's console up with
invoices of tenant ``demo-console`` waiting for a human: sign in with the
token it prints, see the approvals arrive in the inbox, click Approve on one,
and watch that invoice finish on its timeline - paid by the demo's own worker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import _browser
from tests.conftest import Database
from tests.test_console_browser import _row_with, _text, _until

pytestmark = pytest.mark.plain_postgres("a browser session against one plain server is enough")

_BANNER = re.compile(r"the console: (http://127\.0\.0\.1:\d+)/\s+sign in with the token (\S+)")


def _start(
    dsn: str, port: int, tmp_path: Path
) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "demo", "--dsn", dsn, "--tasks", "12",
         "--tenants", "1", "--workers", "1", "--relays", "1", "--kill-every", "0",
         "--seed", "5", "--console", "--console-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, lines, reader


def _banner(proc: subprocess.Popen[str], lines: list[str]) -> tuple[str, str]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = _BANNER.search("".join(lines))
        if found:
            return found.group(1), found.group(2)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError("the demo never offered its console:\n" + "".join(lines)[-3000:])


def test_demo_console_shows_its_approvals_and_one_click_pays_an_invoice(
    db: Database, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    proc, lines, reader = _start(db.admin_dsn, _browser.free_port(), tmp_path)
    d: Any = None
    try:
        base, token = _banner(proc, lines)
        assert "agentdb demo report" in "".join(lines)  # the report came first
        d = _browser.browser()
        d.get(f"{base}/login")
        d.find_element(By.ID, "token").send_keys(token)
        d.find_element(By.CSS_SELECTOR, "#login button").click()
        _until("signed in", lambda: _text(d, "who") == "you@demo")

        # The demo's worker takes the invoices up to their review: they arrive in the inbox.
        def waiting() -> int:
            d.get(f"{base}/inbox")
            return len(d.find_elements(By.XPATH, "//*[@id='approvals']//button[text()='Approve']"))

        _until("the invoices' approvals", lambda: waiting() == 3, 120)  # demo-console's three
        row = _row_with(d, "approvals", "invoice")
        assert row is not None, d.page_source
        link = row.find_element(By.CSS_SELECTOR, "a[href*='/task/']").get_attribute("href")
        row.find_element(By.XPATH, ".//button[text()='Approve']").click()
        _until("the approval", lambda: "approved" in (_text(d, "flash") or ""))
        d.get(link)
        _until("the invoice paid", lambda: _text(d, "task-state") == "succeeded", 120)
        events = _text(d, "events") or ""
        assert "task.approved" in events
        assert "task.succeeded" in events
        assert waiting() == 2  # the paid one left the inbox; the others still wait for you
    finally:
        if d is not None:
            d.quit()
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as the banner says
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode in (0, 130), "".join(lines)[-3000:]
