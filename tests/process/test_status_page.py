"""
The status page (C{GET /} of C{--http-port}) in a real browser against a
real C{twistd jesync}: headless chromium under chromedriver
(L{tests.status_browser}).

 - It shows a held key with its holder (peer, token) and its waiter, and
   when the holder releases it over JESync the page follows without a
   reload: the live stream is read, not the page loaded again (a marker set
   in the page's window survives).
 - With C{--auth-token-file} it asks for the token, and works once it is
   typed; the token goes in no URL.
 - It loads nothing from elsewhere: no C{http://} or C{https://} anywhere
   in it (no CDN, no font, no image).

No console errors or warnings, with one exception: with auth on, the
page's first C{GET /v1/status} is answered 401, which tells the page to
show its login form, and chromium logs every 4xx answer to a fetch() in
the console as a failed load; no fetch() option silences it, and the page
has no other way to learn that a token is needed.  That exact entry, once,
is expected; anything else fails the test.

The screenshot of the first test's page (a held key, its waiter, an HTTP
session) is saved in the test's temporary directory and its path printed;
with C{JESYNC_UPDATE_SCREENSHOT=1} it is also copied to
C{docs/images/status-page.png}, the README's picture.

The browser tests skip, saying what is missing, without selenium (CPython
only), C{/usr/bin/chromium} or C{/usr/bin/chromedriver}; the third test
needs no browser.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import urllib.request
from typing import Any, Optional

from twisted.trial.unittest import SynchronousTestCase

from tests.servers import ROOT, free_port, start_server
from tests.status_browser import WINDOW, browser_missing, console_problems, start_browser
from tests.support import TIMEOUT, TOKEN, accepts, short_temp_dir, write_file

# How long the page has to show a change: a status event comes at most
# every 0.5 s, then the page fetches what it shows.
SHOWN_WITHIN = 15.0
KEY = "reports/nightly"
# A key with what a URL path and HTML would take for syntax: the page must
# percent-encode it (encodeURIComponent) and show it as text.
ODD_KEY = "odd/<b>key</b>?day=1&x=é#top"
SCREENSHOT = ROOT / "docs" / "images" / "status-page.png"

# What the page shows of a key: its row's holders and waiters (read in one
# script run, so a re-render cannot come between two reads).
SHOWN = """
const row = Array.from(document.querySelectorAll("#keys tr.key")).find(r => r.dataset.key === arguments[0]);
if (!row) { return null; }
const group = row.closest("tbody");
const texts = (selector) => Array.from(group.querySelectorAll(selector)).map(e => e.textContent);
return {
  name: row.querySelector("td.key-name").textContent,
  peers: texts(".holder-peer"),
  tokens: texts(".holder-token"),
  values: texts(".holder-value"),
  waiters: texts("li.waiter .waiter-peer"),
  marked: window.__loadedOnce === 1,
  markup: document.querySelectorAll("#keys b").length
};
"""


class JESyncLine:
    """A blocking JESync connection: send a line, read the reply lines."""

    def __init__(self, test: SynchronousTestCase, port: int) -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        test.addCleanup(self.socket.close)
        self.replies = self.socket.makefile("rb")
        test.addCleanup(self.replies.close)
        host, number = self.socket.getsockname()[:2]
        self.peer = f"{host}:{number}"

    def send(self, line: str) -> None:
        self.socket.sendall(line.encode() + b"\n")

    def read(self) -> str:
        return self.replies.readline().decode().rstrip("\n")


def http_json(url: str, body: dict) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        return json.load(response)


class StatusPageServer:
    """A twistd jesync with the HTTP listener on a port of its own (and the JESync port)."""

    def start(self, *extra: str, auth_token: Optional[bytes] = None) -> str:
        self.http_port = free_port()
        self.server = start_server(
            self,
            extra_args=["--http-port", f"tcp:{self.http_port}:interface=127.0.0.1", *extra],
            auth_token=auth_token,
        )
        deadline = time.monotonic() + TIMEOUT
        while not accepts(self.http_port):  # (listening with the JESync port; this just makes sure)
            self.assertLess(time.monotonic(), deadline, f"the HTTP port does not accept:\n{self.server.log()}")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.http_port}"


class StatusPageBrowserTests(StatusPageServer, SynchronousTestCase):
    """The page in headless chromium: live updates, and the token asked for."""

    skip = browser_missing()

    def browser(self) -> Any:
        directory = short_temp_dir(self)
        driver = start_browser(os.path.join(directory, "profile"))
        self.addCleanup(driver.quit)
        # The viewport itself at the screenshot's size (--window-size counts
        # the window's own frame).
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False},
        )
        driver.directory = directory
        return driver

    def wait_shown(self, driver: Any, key: str, wanted, what: str) -> dict:
        """What the page shows of C{key} once C{wanted(shown)} holds (within L{SHOWN_WITHIN} s)."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        seen: list = [None]

        def check(driver: Any) -> Any:
            seen[0] = driver.execute_script(SHOWN, key)
            return seen[0] if seen[0] is not None and wanted(seen[0]) else False

        try:
            return WebDriverWait(driver, SHOWN_WITHIN, poll_frequency=0.05).until(check)
        except TimeoutException:
            self.fail(
                f"the page did not show {what} within {SHOWN_WITHIN} s; it showed {seen[0]!r}\n"
                f"browser log: {driver.get_log('browser')}\nserver log:\n{self.server.log()}"
            )

    def test_held_key_its_waiter_and_a_release_shown_live(self) -> None:
        base = self.start()
        holder = JESyncLine(self, self.server.port)
        holder.send("fencing on")
        holder.send(f"lock {KEY}")
        holder.send(f"lock {ODD_KEY}")
        self.assertEqual(holder.read(), "FENCING ON")
        granted = holder.read().split()
        self.assertEqual(granted[:4], ["GRANTED", "1", "0", KEY], granted)
        first_token = granted[5]
        odd_token = holder.read().split()[5]
        waiter = JESyncLine(self, self.server.port)
        waiter.send("fencing on")
        waiter.send(f"lock {KEY}")
        self.assertEqual(waiter.read(), "FENCING ON")
        # And an HTTP session holding a key with a value, for the sessions
        # table (and the screenshot).
        session = http_json(base + "/v1/sessions", {"ttl": 60})["session"]
        http_json(base + "/v1/acquire", {"session": session, "key": "deploy/production", "value": "release 2026.11"})

        driver = self.browser()
        driver.get(base + "/")
        shown = self.wait_shown(
            driver,
            KEY,
            lambda shown: shown["tokens"] == [first_token] and shown["waiters"] == [waiter.peer],
            "the holder and its waiter",
        )
        self.assertEqual(shown["name"], KEY)
        self.assertEqual(shown["peers"], [holder.peer])
        odd = self.wait_shown(driver, ODD_KEY, lambda shown: shown["tokens"] == [odd_token], "the odd key")
        self.assertEqual(odd["name"], ODD_KEY)
        self.assertEqual(odd["markup"], 0, "a key's text was parsed as HTML")
        self.assertEqual(
            self.wait_shown(driver, "deploy/production", lambda shown: shown["peers"], "the HTTP session's key")[
                "values"
            ],
            ["release 2026.11"],
        )
        sessions = driver.execute_script(
            "return Array.from(document.querySelectorAll('#sessions tbody tr.session')).length"
        )
        self.assertEqual(sessions, 1)
        self.assertEqual(driver.find_element("id", "role").text, "standalone")
        self.assertNotEqual(driver.find_element("id", "uptime").text, "…")
        screenshot = os.path.join(driver.directory, "status-page.png")
        self.assertTrue(driver.save_screenshot(screenshot))
        print(f"status page screenshot: {screenshot}")
        if os.environ.get("JESYNC_UPDATE_SCREENSHOT") == "1":
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(screenshot, SCREENSHOT)
            print(f"status page screenshot copied to {SCREENSHOT}")

        driver.execute_script("window.__loadedOnce = 1")
        holder.send(f"release {KEY}")
        self.assertEqual(holder.read().split()[0], "RELEASED")
        granted = waiter.read().split()
        self.assertEqual(granted[:4], ["GRANTED", "1", "0", KEY], granted)
        second_token = granted[5]
        shown = self.wait_shown(
            driver,
            KEY,
            lambda shown: shown["tokens"] == [second_token] and shown["waiters"] == [],
            "the waiter holding the key",
        )
        self.assertEqual(shown["peers"], [waiter.peer])
        self.assertTrue(shown["marked"], "the page was loaded again")
        self.assertEqual(console_problems(driver), [])

    def test_key_list_fetched_at_most_every_5_s(self) -> None:
        """
        Status events come every 0.5 s while the table changes: the page
        fetches what it shows on each (the sessions), but the key list's
        page at most every 5 s (and once more when it is due, so the last
        change is shown).
        """
        base = self.start()
        holder = JESyncLine(self, self.server.port)
        driver = self.browser()
        driver.get(base + "/")
        driver.execute_script("performance.setResourceTimingBufferSize(100000)")
        holder.send("lock first")
        self.assertEqual(holder.read().split()[0], "GRANTED")
        self.wait_shown(driver, "first", lambda shown: shown["peers"], "the first key")
        fetched = "return performance.getEntriesByType('resource').filter(e => e.name.includes(arguments[0])).length"
        lists = driver.execute_script(fetched, "/v1/locks?order=key")
        started = time.monotonic()
        for number in range(6):
            sessions = driver.execute_script(fetched, "/v1/sessions?")
            holder.send(f"lock k{number}")
            self.assertEqual(holder.read().split()[0], "GRANTED")
            deadline = time.monotonic() + SHOWN_WITHIN
            while driver.execute_script(fetched, "/v1/sessions?") == sessions:  # (a status event's refresh)
                self.assertLess(time.monotonic(), deadline, "no refresh after a change")
                time.sleep(0.05)
        elapsed = time.monotonic() - started
        listed = driver.execute_script(fetched, "/v1/locks?order=key") - lists
        self.assertLessEqual(listed, 1 + int(elapsed / 5), f"{listed} key list pages in {elapsed:.1f} s")
        from selenium.webdriver.support.ui import WebDriverWait

        in_list = "return document.querySelector('#key-list tr.key[data-key=\"k5\"]') !== null"
        WebDriverWait(driver, SHOWN_WITHIN, poll_frequency=0.05).until(lambda driver: driver.execute_script(in_list))
        self.assertEqual(console_problems(driver), [])

    def test_token_asked_for_then_the_page_works(self) -> None:
        base = self.start("--auth-token-file", write_file(self, TOKEN + b"\n"), auth_token=TOKEN)
        holder = JESyncLine(self, self.server.port)
        holder.send(f"auth {TOKEN.decode()}")
        holder.send("fencing on")
        holder.send(f"lock {KEY}")
        self.assertEqual([holder.read(), holder.read()], ["OK", "FENCING ON"])
        token = holder.read().split()[5]

        driver = self.browser()
        driver.get(base + "/")
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, SHOWN_WITHIN).until(expected_conditions.visibility_of_element_located(("id", "login")))
        self.assertIsNone(driver.execute_script(SHOWN, KEY))
        driver.find_element("id", "token").send_keys(TOKEN.decode())
        driver.find_element("id", "login-submit").click()
        shown = self.wait_shown(driver, KEY, lambda shown: shown["tokens"] == [token], "the held key")
        self.assertEqual(shown["peers"], [holder.peer])
        self.assertFalse(driver.find_element("id", "login").is_displayed())
        self.assertNotIn(TOKEN.decode(), driver.current_url)
        self.assertEqual(driver.current_url, base + "/")
        first_answer = (
            f"{base}/v1/status - Failed to load resource: the server responded with a status of 401 (Unauthorized)"
        )
        self.assertEqual([entry["message"] for entry in console_problems(driver)], [first_answer])


class StatusPageSourceTests(StatusPageServer, SynchronousTestCase):
    """The page as served: HTML, and nothing in it from elsewhere."""

    def test_no_external_url(self) -> None:
        base = self.start()
        with urllib.request.urlopen(base + "/", timeout=TIMEOUT) as response:
            self.assertEqual(response.status, 200)
            self.assertEqual(response.headers.get_content_type(), "text/html")
            page = response.read().decode("utf-8")
        self.assertIn("<title>jesync status</title>", page)
        for external in ("http://", "https://", "url(", "@import", " src=", 'rel="stylesheet"'):
            self.assertNotIn(external, page.lower())
