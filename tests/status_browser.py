"""
A real browser for the status page's tests: Debian's C{chromium} driven by
its C{chromium-driver} through C{selenium}, both paths given so nothing is
looked up or downloaded at run time (selenium's own driver manager is never
asked).  Headless, with no sandbox (CI runs as root), no GPU, no background
networking or component updates (the page must work with no network beyond
the server), and a profile of its own in the test's temporary directory.

L{browser_missing} says what is missing (so the tests skip loudly, naming
it) or C{None}; L{start_browser} starts one; L{console_problems} is what
the page logged at warning level or above, which the tests require empty.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Iterable, Optional

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 800)


def browser_missing() -> Optional[str]:
    """Why no browser test can run here (what is missing, and how to get it), or C{None}."""
    if platform.python_implementation() != "CPython":
        return f"the status page's browser tests are SKIPPED: they run under CPython only (this is {platform.python_implementation()})"
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install '.[test]')")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            missing.append(f"{path} (apt-get install {package}; .ci/run does, as root)")
    if missing:
        return "the status page's browser tests are SKIPPED: they need " + ", ".join(missing)
    return None


def start_browser(profile: str) -> Any:
    """A headless chromium under chromedriver, its profile in C{profile}; quit it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    # The page's console (errors, warnings, and failed loads), for driver.get_log("browser").
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def console_problems(driver: Any, expected: Iterable[str] = ()) -> list[dict]:
    """
    The browser log's entries at WARNING or above (console errors and
    warnings, and loads that failed), except those whose message contains
    one of C{expected}.  Reading the log empties it.
    """
    allowed = list(expected)
    return [
        entry
        for entry in driver.get_log("browser")
        if entry.get("level") in ("WARNING", "SEVERE")
        and not any(text in entry.get("message", "") for text in allowed)
    ]
