#!/usr/bin/env python3
"""Screenshots of cudatrace's HTML pages in headless Chromium (Playwright, the system browser).

    python3 tools/screenshot_report.py PAGE.html OUT.png [--width 1280] [--full-page]
        [--click-moment N] [--search TEXT] [--clip-to SELECTOR]
    python3 tools/screenshot_report.py --demo OUT.png
        runs `cudatrace demo --simulated`, renders the report of its --kv-cache-memory 1GiB
        trace and the diff against --num-blocks 64, and shoots the report (docs/ keeps it)

The page is opened from disk with every request routed: anything but file: and data: URLs is
refused and reported (the pages must load nothing from the network). Console errors and page
errors are printed and make the exit status 1. The browser is the system's Chromium
($CUDATRACE_CHROMIUM, else /usr/bin/chromium); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def chromium_path() -> str:
    for p in (
        os.environ.get("CUDATRACE_CHROMIUM"),
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
    ):
        if p and os.path.exists(p):
            return p
    raise SystemExit(
        "no Chromium: install the system package (apt-get install -y chromium) or "
        "set CUDATRACE_CHROMIUM"
    )


class Page:
    """A loaded page with what went wrong collected: console errors, page errors, requests
    that were not file: or data: URLs."""

    def __init__(self, browser, path: Path, width: int = 1280, height: int = 900):
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.context = browser.new_context(
            viewport={"width": width, "height": height}, device_scale_factor=1
        )
        self.page = self.context.new_page()
        self.page.route("**/*", self._route)
        self.page.on(
            "console",
            lambda m: (
                self.errors.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.goto(Path(path).resolve().as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=15000)

    def _route(self, route):
        url = route.request.url
        if url.startswith("file:") or url.startswith("data:"):
            route.continue_()
        else:
            self.requests.append(url)
            route.abort()

    def click_moment(self, index: int) -> None:
        """Click the timeline at the x of moment `index` (a real mouse click)."""
        tick = self.page.locator("#timeline rect.mtick[data-i='%d']" % index)
        box = tick.bounding_box()
        over = self.page.locator("#timeline rect.overlay").bounding_box()
        self.page.mouse.click(box["x"] + box["width"] / 2, over["y"] + over["height"] / 2)

    def close(self) -> None:
        self.context.close()


def launch(playwright):
    return playwright.chromium.launch(
        executable_path=chromium_path(),
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    )


def shoot(
    html: Path,
    out: Path,
    width: int = 1280,
    full_page: bool = False,
    click_moment: int | None = None,
    search: str | None = None,
    clip_to: str | None = None,
    height: int = 900,
) -> list[str]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        try:
            pg = Page(browser, html, width, height)
            if click_moment is not None:
                pg.click_moment(click_moment)
            if search:
                pg.page.fill("#search", search)
            pg.page.mouse.move(0, 0)
            if clip_to:
                box = pg.page.locator(clip_to).bounding_box()
                pg.page.screenshot(
                    path=str(out),
                    full_page=True,
                    clip={"x": 0, "y": 0, "width": width, "height": box["y"] + box["height"] + 16},
                )
            else:
                pg.page.screenshot(path=str(out), full_page=full_page)
            problems = pg.errors + [f"network request: {u}" for u in pg.requests]
            pg.close()
        finally:
            browser.close()
    return problems


def demo(out: Path) -> list[str]:
    """The README's picture: the report of the demo's --kv-cache-memory 1GiB trace."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CUDASIM_") and k != "LD_PRELOAD"
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="cudatrace-") as tmp:
        t = Path(tmp)
        # the page shows the command line: run in the folder, with short relative paths
        subprocess.run(
            [sys.executable, "-m", "cudatrace", "demo", "--simulated", "-o", "demo"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=t,
        )
        html = t / "report.html"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cudatrace",
                "report",
                "demo/kv-cache-memory-1GiB",
                "--html",
                str(html),
            ],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=t,
        )
        return shoot(html, out, width=1280, clip_to="#flame-card")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", nargs="?", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--demo", action="store_true", help="render and shoot the demo's report")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--full-page", action="store_true")
    ap.add_argument("--click-moment", type=int)
    ap.add_argument("--search")
    ap.add_argument("--clip-to", help="shoot from the top down to this element's bottom")
    a = ap.parse_args(argv)
    if a.demo:
        problems = demo(a.out)
    else:
        if a.html is None:
            ap.error("give PAGE.html, or --demo")
        problems = shoot(
            a.html, a.out, a.width, a.full_page, a.click_moment, a.search, a.clip_to, a.height
        )
    for p in problems:
        print(p, file=sys.stderr)
    print(a.out)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
