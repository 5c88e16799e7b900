"""A real headless Chromium for the console's browser tests, and the console as a process.

Debian's ``chromium`` and ``chromium-driver`` are installed when missing and
we may (root with apt-get), as the PgBouncer tests install PgBouncer; with no
browser and no way to install one the tests fail and say how - they are never
skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"


def ensure_chromium() -> tuple[str, str]:
    """The chromium and chromedriver binaries, installed from Debian's packages if missing."""
    missing = not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER))
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
        for cmd in (["apt-get", "update", "-q"], install):
            subprocess.run(cmd, env=env, capture_output=True, check=False, timeout=900)
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        raise RuntimeError(
            "the console's browser tests need Chromium and its driver (Debian: apt-get install"
            " -y chromium chromium-driver) - they are never skipped"
        )
    return CHROMIUM, DRIVER


def browser() -> Any:
    """A headless Chromium driven by Selenium (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def console(
    dsn: str, principals: list[dict[str, Any]], folder: Path
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``agentdb console`` as a process on a free loopback port; yields its base URL."""
    path = folder / "principals.json"
    path.write_text(json.dumps({"principals": principals}), encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "console", "--dsn", dsn, "--principals", str(path),
         "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the console exited: {proc.stdout.read() if proc.stdout else ''}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the console did not open its port within 30 s")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
