"""
tooz's own test suite as a test of ours: tooz 9.1.0's
C{tooz/tests/test_coordination.py} (83 tests) and C{test_partitioner.py}
(15), run as tooz runs them for its drivers (C{TOOZ_TEST_URL}), in a pytest
subprocess, against a real C{twistd jesync}; every test's outcome is read
from the run's JUnit XML and compared with L{EXPECTED}.

L{EXPECTED} is the record of what the jesync backend does in tooz's own
terms: one entry per test, C{"passed"} or C{"skipped"} (tooz's tests skip
what a driver raises C{tooz.NotImplemented} for).  A test that newly skips
or fails fails this test; so does one that newly passes, until the table
says so: a change to the backend shows here as a change to the table, made
in the same commit.  Today: 82 passed and 1 skipped of
test_coordination.py (the five no other driver passes among the passed;
skipped: test_watch_join_group_disappear, which runs only for tooz's own
etcd3gw, memcached and redis driver classes), and test_partitioner.py's 15
of 15.  docs/clients.md's table of tooz's suite gives the jesync row
L{EXPECTED} records (L{RecordTests}).

The URL carries the server's admin endpoint and its token file
(C{admin=HOST:PORT&admin_token_file=PATH}), for tooz's lock C{break_()}
(C{test_get_lock_release_broken}) and for booting out a member id joined
through another connection (C{test_watch_join_group_booted_out}).

The run takes about 26 s on CPython 3.11 (25 s of it tooz's 98 tests:
test_timeout waits 6 s for a member's 5 s lease to lapse, the partitioner's
tests and the watchers' loops most of the rest).  Skipped, with a
message, under PyPy (the test extra installs tooz under CPython only) and
with any tooz but the release the table records.
"""

# What tooz 9.1.0's test_coordination.py gives each of its drivers, as the
# issue measured it (run with TOOZ_TEST_URL against real servers):
#
#   driver                 passed  skipped (NotImplemented)
#   memcached                73       10
#   redis                    71       12
#   file                     67       16
#   etcd3gw                  65       18
#   jesync (locks only)      29       54   (before issue 25's driver)
#   jesync                   82        1
#
# and test_partitioner.py: 15/15 on redis, memcached, etcd3gw and file, and
# now on jesync (0/15 before).  No driver passes everything: shared locks exist only in the
# file driver, stand-down only in memcached, break_() only in redis,
# memcached and etcd3gw.

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional
from urllib.parse import urlencode
from unittest import SkipTest
from xml.etree import ElementTree

from twisted.trial.unittest import SynchronousTestCase

from tests.doc_pages import ROOT, section
from tests.servers import free_port, start_server

#: The tooz release whose tests L{EXPECTED} records.
TOOZ_RELEASE = "9.1.0"
#: tooz's test modules run, in its package's tests directory.
TOOZ_TEST_MODULES = ("test_coordination.py", "test_partitioner.py")
#: The longest the subprocess may take (today's run takes about 25 s:
#: tooz's test_timeout and its watchers wait on real leases).
SUITE_WITHIN = 600.0

#: The tests of test_coordination.py that no driver passes (the issue's
#: "step beyond every driver"): tooz's get_member_info, and a stand-down that
#: hands leadership to the next candidate.
NO_DRIVER_PASSES = frozenset(
    {
        "test_coordination.py::TestAPI::test_get_member_info",
        "test_coordination.py::TestAPI::test_get_member_info_complex",
        "test_coordination.py::TestAPI::test_get_member_info_nonexistent_group",
        "test_coordination.py::TestAPI::test_get_member_info_nonjoined_member",
        "test_coordination.py::TestAPI::test_run_for_election_multiple_clients_stand_down",
    }
)

#: Every test's outcome against jesync today: the record (see the module's
#: documentation), keyed as MODULE::CLASS::TEST.
EXPECTED = {
    "test_coordination.py::TestAPI::test_acquire_twice_no_deadlock_releasing": "passed",
    "test_coordination.py::TestAPI::test_connection_error_bad_host": "passed",
    "test_coordination.py::TestAPI::test_create_group": "passed",
    "test_coordination.py::TestAPI::test_create_group_already_exist": "passed",
    "test_coordination.py::TestAPI::test_delete_group": "passed",
    "test_coordination.py::TestAPI::test_delete_group_non_empty": "passed",
    "test_coordination.py::TestAPI::test_delete_group_non_existent": "passed",
    "test_coordination.py::TestAPI::test_disconnect_leave_group": "passed",
    "test_coordination.py::TestAPI::test_ensure_acquire_release_return": "passed",
    "test_coordination.py::TestAPI::test_get_groups": "passed",
    "test_coordination.py::TestAPI::test_get_groups_str_group_id": "passed",
    "test_coordination.py::TestAPI::test_get_leader": "passed",
    "test_coordination.py::TestAPI::test_get_lock": "passed",
    "test_coordination.py::TestAPI::test_get_lock_concurrency_locking2": "passed",
    "test_coordination.py::TestAPI::test_get_lock_concurrency_locking_same_lock": "passed",
    "test_coordination.py::TestAPI::test_get_lock_concurrency_locking_two_lock_process": "passed",
    "test_coordination.py::TestAPI::test_get_lock_concurrency_locking_two_lock_thread1": "passed",
    "test_coordination.py::TestAPI::test_get_lock_concurrency_locking_two_lock_thread2": "passed",
    "test_coordination.py::TestAPI::test_get_lock_context_check_value": "passed",
    "test_coordination.py::TestAPI::test_get_lock_context_fails": "passed",
    "test_coordination.py::TestAPI::test_get_lock_locked_twice": "passed",
    "test_coordination.py::TestAPI::test_get_lock_locking_exclusive_and_shared": "passed",
    "test_coordination.py::TestAPI::test_get_lock_locking_shared_and_exclusive": "passed",
    "test_coordination.py::TestAPI::test_get_lock_multiple_coords": "passed",
    "test_coordination.py::TestAPI::test_get_lock_release_broken": "passed",
    "test_coordination.py::TestAPI::test_get_lock_serial_locking_two_lock_process": "passed",
    "test_coordination.py::TestAPI::test_get_lock_twice_locked_one_released_two": "passed",
    "test_coordination.py::TestAPI::test_get_lock_twice_locked_twice": "passed",
    "test_coordination.py::TestAPI::test_get_member_capabilities": "passed",
    "test_coordination.py::TestAPI::test_get_member_capabilities_complex": "passed",
    "test_coordination.py::TestAPI::test_get_member_capabilities_nonexistent_group": "passed",
    "test_coordination.py::TestAPI::test_get_member_capabilities_nonjoined_member": "passed",
    "test_coordination.py::TestAPI::test_get_member_info": "passed",
    "test_coordination.py::TestAPI::test_get_member_info_complex": "passed",
    "test_coordination.py::TestAPI::test_get_member_info_nonexistent_group": "passed",
    "test_coordination.py::TestAPI::test_get_member_info_nonjoined_member": "passed",
    "test_coordination.py::TestAPI::test_get_members": "passed",
    "test_coordination.py::TestAPI::test_get_members_str_member_id": "passed",
    "test_coordination.py::TestAPI::test_get_members_with_capabilities": "passed",
    "test_coordination.py::TestAPI::test_get_members_with_capabilities_empty_group": "passed",
    "test_coordination.py::TestAPI::test_get_members_with_capabilities_multiple": "passed",
    "test_coordination.py::TestAPI::test_get_members_with_capabilities_no_caps": "passed",
    "test_coordination.py::TestAPI::test_get_members_with_capabilities_nonexistent_group": "passed",
    "test_coordination.py::TestAPI::test_get_multiple_locks_with_same_coord": "passed",
    "test_coordination.py::TestAPI::test_get_shared_lock": "passed",
    "test_coordination.py::TestAPI::test_get_shared_lock_locking_same_lock_twice": "passed",
    "test_coordination.py::TestAPI::test_get_shared_lock_locking_two_lock": "passed",
    "test_coordination.py::TestAPI::test_get_started_status": "passed",
    "test_coordination.py::TestAPI::test_heartbeat": "passed",
    "test_coordination.py::TestAPI::test_heartbeat_lock_not_acquired": "passed",
    "test_coordination.py::TestAPI::test_heartbeat_loop": "passed",
    "test_coordination.py::TestAPI::test_join_group": "passed",
    "test_coordination.py::TestAPI::test_join_group_create": "passed",
    "test_coordination.py::TestAPI::test_join_group_with_member_id_already_exists": "passed",
    "test_coordination.py::TestAPI::test_join_nonexistent_group": "passed",
    "test_coordination.py::TestAPI::test_leave_group": "passed",
    "test_coordination.py::TestAPI::test_leave_group_not_joined_by_member": "passed",
    "test_coordination.py::TestAPI::test_leave_nonexistent_group": "passed",
    "test_coordination.py::TestAPI::test_lock_context_manager_acquire_argument": "passed",
    "test_coordination.py::TestAPI::test_lock_context_manager_acquire_argument_release_within": "passed",
    "test_coordination.py::TestAPI::test_lock_context_manager_acquire_argument_return_value": "passed",
    "test_coordination.py::TestAPI::test_lock_context_manager_acquire_argument_timeout": "passed",
    "test_coordination.py::TestAPI::test_lock_context_manager_acquire_no_argument": "passed",
    "test_coordination.py::TestAPI::test_run_for_election": "passed",
    "test_coordination.py::TestAPI::test_run_for_election_multiple_clients": "passed",
    "test_coordination.py::TestAPI::test_run_for_election_multiple_clients_stand_down": "passed",
    "test_coordination.py::TestAPI::test_stop_first": "passed",
    "test_coordination.py::TestAPI::test_timeout": "passed",
    "test_coordination.py::TestAPI::test_unwatch_elected_as_leader": "passed",
    "test_coordination.py::TestAPI::test_unwatch_elected_as_leader_callback_not_found": "passed",
    "test_coordination.py::TestAPI::test_unwatch_join_group_callback_not_found": "passed",
    "test_coordination.py::TestAPI::test_unwatch_leave_group": "passed",
    "test_coordination.py::TestAPI::test_unwatch_leave_group_callback_not_found": "passed",
    "test_coordination.py::TestAPI::test_update_capabilities": "passed",
    "test_coordination.py::TestAPI::test_update_capabilities_with_group_id_nonexistent": "passed",
    "test_coordination.py::TestAPI::test_watch_group_join": "passed",
    "test_coordination.py::TestAPI::test_watch_join_group_booted_out": "passed",
    "test_coordination.py::TestAPI::test_watch_join_group_disappear": "skipped",
    "test_coordination.py::TestAPI::test_watch_join_group_non_existent": "passed",
    "test_coordination.py::TestAPI::test_watch_leave_group": "passed",
    "test_coordination.py::TestAPI::test_watch_leave_group_non_existent": "passed",
    "test_coordination.py::TestHook::test_register_hook": "passed",
    "test_coordination.py::TestHook::test_unregister_hook": "passed",
    "test_partitioner.py::TestPartitioner::test_hashring_size": "passed",
    "test_partitioner.py::TestPartitioner::test_hashring_weight": "passed",
    "test_partitioner.py::TestPartitioner::test_join_partitioned_group": "passed",
    "test_partitioner.py::TestPartitioner::test_members_of_object_and_others": "passed",
    "test_partitioner.py::TestPartitioner::test_stop": "passed",
    "test_partitioner.py::IPCTestPartitioner::test_hashring_size": "passed",
    "test_partitioner.py::IPCTestPartitioner::test_hashring_weight": "passed",
    "test_partitioner.py::IPCTestPartitioner::test_join_partitioned_group": "passed",
    "test_partitioner.py::IPCTestPartitioner::test_members_of_object_and_others": "passed",
    "test_partitioner.py::IPCTestPartitioner::test_stop": "passed",
    "test_partitioner.py::FileTestPartitioner::test_hashring_size": "passed",
    "test_partitioner.py::FileTestPartitioner::test_hashring_weight": "passed",
    "test_partitioner.py::FileTestPartitioner::test_join_partitioned_group": "passed",
    "test_partitioner.py::FileTestPartitioner::test_members_of_object_and_others": "passed",
    "test_partitioner.py::FileTestPartitioner::test_stop": "passed",
}


def outcomes(junit_xml: str) -> dict[str, tuple[str, str]]:
    """
    Each test's outcome in a pytest JUnit XML report, keyed as L{EXPECTED}
    is: C{"passed"}, C{"skipped"} or C{"failed"} (a failure or an error,
    in the test or its set-up), with pytest's message.
    """
    found: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module, test_class = (["?", "?"] + case.get("classname", "?.?").split("."))[-2:]
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or ""
                break
            if child.tag == "skipped":
                outcome, message = "skipped", child.get("message") or ""
        found[f"{module}.py::{test_class}::{case.get('name')}"] = (outcome, message)
    return found


def differences(found: dict[str, tuple[str, str]]) -> list[str]:
    """One line per test whose outcome is not the one L{EXPECTED} records (C{"absent"}: not run, or not recorded)."""
    lines = []
    for test in sorted(set(EXPECTED) | set(found)):
        expected = EXPECTED.get(test, "absent")
        outcome, message = found.get(test, ("absent", ""))
        if outcome != expected:
            beyond = " [no driver passes it]" if test in NO_DRIVER_PASSES else ""
            lines.append(f"{test}: {expected} -> {outcome}{beyond}" + (f": {message}" if message else ""))
    return lines


def counts(results: dict[str, str], module: str) -> dict[str, int]:
    """How many of one module's tests had each outcome (C{results}: outcome by test, as L{EXPECTED})."""
    found: dict[str, int] = {}
    for test, outcome in results.items():
        if test.startswith(module + "::"):
            found[outcome] = found.get(outcome, 0) + 1
    return found


def tally(results: dict[str, str], module: str) -> str:
    """C{"N passed, M skipped"} (and failed, absent) of one module's tests."""
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts(results, module).items())) or "none"


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class RecordTests(SynchronousTestCase):
    def test_the_docs_say_what_the_record_says(self) -> None:
        """
        docs/clients.md's table of tooz's suite gives jesync's row as
        L{EXPECTED} records it: test_coordination.py's passed and skipped,
        and test_partitioner.py's passed of its whole.
        """
        text = section((ROOT / "docs" / "clients.md").read_text(encoding="utf-8"), "A tooz backend")
        assert text is not None, "docs/clients.md has no 'A tooz backend' section"
        row = re.search(r"^\| \*\*jesync\*\* \|(.*)\|$", text, re.M)
        assert row is not None, "docs/clients.md's tooz section has no jesync row"
        coordination = counts(EXPECTED, "test_coordination.py")
        partitioner = counts(EXPECTED, "test_partitioner.py")
        self.assertEqual(
            [cell.strip(" *") for cell in row.group(1).split("|")],
            [
                str(coordination.get("passed", 0)),
                str(coordination.get("skipped", 0)),
                f"{partitioner.get('passed', 0)} of {sum(partitioner.values())}",
            ],
        )


class ToozSuiteTests(SynchronousTestCase):
    def setUp(self) -> None:
        if platform.python_implementation() != "CPython":
            raise SkipTest(
                "tooz's own suite runs under CPython only: the test extra installs tooz there alone (under PyPy, "
                "tooz's psutil must be built against PyPy's C headers, pypy3-dev)"
            )
        from importlib import metadata

        try:
            release: Optional[str] = metadata.version("tooz")
        except metadata.PackageNotFoundError:
            release = None
        if release != TOOZ_RELEASE:
            raise SkipTest(
                f"the record of tooz's own suite is tooz {TOOZ_RELEASE}'s (the test extra installs it on Python 3.11 "
                f"and later); this Python has {'tooz ' + release if release else 'no tooz'}"
            )

    def test_tooz_suite(self) -> None:
        """
        tooz's test_coordination.py and test_partitioner.py, run against
        twistd jesync (its admin endpoint in the URL): every test's outcome
        is the one L{EXPECTED} records, and nothing fails.
        """
        import tooz

        from tests.tooz_case import subprocess_environment

        self.assertLessEqual(NO_DRIVER_PASSES, set(EXPECTED))
        directory = tempfile.mkdtemp(prefix="jesync-tooz-suite-")
        self.addCleanup(shutil.rmtree, directory, True)
        admin_token_file = os.path.join(directory, "admin-token")
        with open(admin_token_file, "w") as file:
            file.write("tooz-suite-admin-token\n")
        admin_port = free_port()
        server = start_server(
            self,
            extra_args=[
                "--admin-port",
                f"tcp:{admin_port}:interface=127.0.0.1",
                "--admin-token-file",
                admin_token_file,
            ],
        )
        admin = {"admin": f"127.0.0.1:{admin_port}", "admin_token_file": admin_token_file}
        url = f"jesync://{server.address}?{urlencode(admin)}"

        # A pytest of its own: an empty configuration (not this checkout's
        # tox.ini, nor any conftest.py), one process, no cache written; the
        # root is tooz's tests directory, so that a test is named
        # MODULE.CLASS (and its name) in the report.  --import-mode=append:
        # pytest puts tooz's package directory (site-packages) after the
        # PYTHONPATH, not before it, so the driver tested is this
        # checkout's, not an installed jesync's.
        configuration = os.path.join(directory, "pytest.ini")
        with open(configuration, "w") as file:
            file.write("[pytest]\n")
        report = os.path.join(directory, "outcomes.xml")
        tests_directory = os.path.join(os.path.dirname(tooz.__file__), "tests")
        command = [
            sys.executable,
            "-m",
            "pytest",
            *(os.path.join(tests_directory, module) for module in TOOZ_TEST_MODULES),
            "-c",
            configuration,
            "--rootdir",
            tests_directory,
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "--import-mode=append",
            "-n",
            "0",
            "-q",
            "-rfE",
            f"--junitxml={report}",
        ]
        started = time.monotonic()
        try:
            run = subprocess.run(
                command,
                env=dict(subprocess_environment(), TOOZ_TEST_URL=url),
                cwd=directory,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=SUITE_WITHIN,
            )
        except subprocess.TimeoutExpired as timeout:
            output = timeout.stdout.decode(errors="replace") if isinstance(timeout.stdout, bytes) else timeout.stdout
            self.fail(f"tooz's suite did not end within {SUITE_WITHIN} s:\n{tail(output or '')}\n{tail(server.log())}")
        took = time.monotonic() - started
        output = f"{tail(run.stdout)}\n{tail(run.stderr, 20)}\nthe server's log:\n{tail(server.log(), 30)}"
        self.assertTrue(os.path.exists(report), f"pytest wrote no report (exit {run.returncode}):\n{output}")

        found = outcomes(report)
        results = {test: outcome for test, (outcome, _) in found.items()}
        wrong = differences(found)
        if wrong:
            self.fail(
                f"tooz's suite against jesync ({took:.1f} s): test_coordination.py "
                f"{tally(results, 'test_coordination.py')}, test_partitioner.py "
                f"{tally(results, 'test_partitioner.py')}; "
                f"expected test_coordination.py {tally(EXPECTED, 'test_coordination.py')}, test_partitioner.py "
                f"{tally(EXPECTED, 'test_partitioner.py')}.  Not as recorded (update EXPECTED where the backend "
                f"has changed):\n" + "\n".join(wrong) + f"\n\npytest's output:\n{output}"
            )
        self.assertEqual(run.returncode, 0, output)
