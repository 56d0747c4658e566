"""
The C{jesync} command line's arguments, parsed and refused in this process
(L{jesync.cli.main} and L{jesync.cli.parse_arguments}, no server, no
subprocess): help, usage errors, whole option names, the exit statuses.
The command line run as a process is tests/process/test_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import os

from twisted.trial.unittest import SynchronousTestCase

from jesync.cli import (
    EXIT_BUSY,
    EXIT_CANNOT_RUN,
    EXIT_LOCK_LOST,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    build_parser,
    main,
    parse_arguments,
)


def run_in_process(*argv: str) -> tuple[int, str, str]:
    """Run C{main} here (fast, for what needs no server): its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
    return status, out.getvalue(), err.getvalue()


class ArgumentTests(SynchronousTestCase):
    def test_help_everywhere(self) -> None:
        """
        Every command has --help with examples; the main help documents the
        exit statuses (that one run as a process: tests/process/test_cli.py).
        """
        for command in ("lock", "status", "list", "ping"):
            status, out, _ = run_in_process(command, "--help")
            self.assertEqual(status, 0, command)
            self.assertIn("examples:", out, command)
        lock_help = run_in_process("lock", "--help")[1]
        for text in ["--terminate-on-loss", "--nonblock", "-c STRING", "JESYNC_KEY", "flock"]:
            self.assertIn(text, lock_help)
        # How it differs from flock(1): its -n, and its exit statuses.
        self.assertRegex(" ".join(lock_help.split()), r"Compared with flock\(1\): -n here is --max-concurrent")

    def test_command_after_double_dash(self) -> None:
        """Everything after -- is COMMAND, its own options included."""
        args = parse_arguments(["lock", "k", "--wait", "5", "--", "ls", "-l", "--", "x"])
        self.assertEqual((args.key, args.wait, args.command), ("k", 5.0, ["ls", "-l", "--", "x"]))
        self.assertEqual(parse_arguments(["lock", "k", "make"]).command, ["make"])

    def test_shell_command(self) -> None:
        """-c STRING (--command) is /bin/sh -c STRING, before or after KEY."""
        for argv in (["lock", "k", "-c", "a | b"], ["lock", "--command", "a | b", "k"]):
            args = parse_arguments(argv)
            self.assertEqual((args.key, args.command), ("k", ["/bin/sh", "-c", "a | b"]), argv)

    def test_nonblock_and_conflict_exit_code(self) -> None:
        """--nonblock's conflict status is flock's 1, a timed-out --wait's 75; -E sets either."""
        for argv, nonblock, status in (
            (["lock", "k", "x"], False, EXIT_TIMEOUT),
            (["lock", "--wait", "3", "k", "x"], False, EXIT_TIMEOUT),
            (["lock", "--nonblock", "k", "x"], True, EXIT_BUSY),
            (["lock", "--nonblock", "-E", "0", "k", "x"], True, 0),
            (["lock", "-w", "0", "-E", "3", "k", "x"], False, 3),
        ):
            args = parse_arguments(argv)
            self.assertEqual((args.nonblock, args.conflict_exit_code), (nonblock, status), argv)

    def test_servers(self) -> None:
        """--server before or after the command, repeated or comma-separated; else JESYNC_SERVERS; else the default."""
        previous = os.environ.pop("JESYNC_SERVERS", None)
        self.addCleanup(lambda: previous is None or os.environ.__setitem__("JESYNC_SERVERS", previous))
        self.assertEqual([str(s) for s in parse_arguments(["ping"]).servers], ["127.0.0.1:11400"])
        os.environ["JESYNC_SERVERS"] = "a:1 b:2"
        self.assertEqual([str(s) for s in parse_arguments(["ping"]).servers], ["a:1", "b:2"])
        args = parse_arguments(["-s", "c", "ping", "--server", "d,[::1]:5"])
        self.assertEqual([str(s) for s in args.servers], ["d:11400", "[::1]:5"])
        args = parse_arguments(["--server", "c", "--placement", "php", "ping"])
        self.assertEqual(([str(s) for s in args.servers], args.placement), (["c:11400"], "php"))
        del os.environ["JESYNC_SERVERS"]

    def test_bad_arguments(self) -> None:
        for argv in (
            ["lock", "two words", "--", "true"],
            ["lock", "k", "--wait", "-1", "--", "true"],
            ["lock", "k", "--wait", "soon", "--", "true"],
            ["lock", "k", "--max-concurrent", "0", "--", "true"],
            ["lock", "k", "--conflict-exit-code", "256", "--", "true"],
            ["status"],
            ["status", "k", "--", "x"],
            ["--server", "host:99999", "ping"],
            ["list", "--by", "size"],
            [],
        ):
            status, _, err = run_in_process(*argv)
            self.assertEqual(status, 2, argv)
            self.assertIn("usage:", err, argv)

    def test_usage_errors_show_the_command_usage(self) -> None:
        """
        A usage error in jesync lock (or any command) prints that command's
        usage and the error, status 2; one before the command, jesync's.
        """
        lock_usage = "usage: jesync lock [options] KEY -- COMMAND [ARGS...]\n       jesync lock [options] KEY -c STRING\n"
        for argv, error in (
            (["lock"], "the following arguments are required: KEY"),
            (["lock", "k"], "a COMMAND to run is needed"),
            (["lock", "--bogus", "k", "--", "true"], "unrecognized arguments: --bogus"),
            (["lock", "k", "--", "true", "--server", "x"], None),  # after --: COMMAND's own
            (["lock", "two words", "--", "true"], "a key cannot contain whitespace"),
            (["lock", "k", "--wait", "soon", "--", "true"], "argument --wait/-w"),
            (["lock", "k", "-E", "300", "--", "true"], "argument --conflict-exit-code/-E"),
            (["lock", "--nonblock", "--wait", "1", "k", "--", "true"], "not allowed with argument"),
            (["lock", "k", "-c", "echo", "--", "true"], "give -c STRING or a COMMAND after KEY, not both"),
            (["lock", "-c", "echo", "k", "true"], "give -c STRING or a COMMAND after KEY, not both"),
            (["lock", "k", "-c", "echo", "true"], "unrecognized arguments: true"),
            (["lock", "k", "-c"], "argument -c/--command: expected one argument"),
            (["lock", "k", "--server", "host:99999", "--", "true"], "host:99999"),
        ):
            if error is None:
                self.assertEqual(parse_arguments(argv).command, ["true", "--server", "x"])
                continue
            status, out, err = run_in_process(*argv)
            self.assertEqual((status, out), (2, ""), argv)
            self.assertTrue(err.startswith(lock_usage), (argv, err))
            self.assertIn("jesync lock: error: ", err, argv)
            self.assertIn(error, err, argv)
        status, _, err = run_in_process("status", "k", "--bogus")
        self.assertEqual(status, 2)
        self.assertTrue(err.startswith("usage: jesync status "), err)
        self.assertIn("jesync status: error: unrecognized arguments: --bogus", err)
        status, _, err = run_in_process("--bogus", "lock", "k", "--", "true")
        self.assertEqual(status, 2)
        self.assertTrue(err.startswith("usage: jesync [-h]"), err)
        self.assertIn("jesync: error: unrecognized arguments: --bogus", err)

    def test_whole_option_names_only(self) -> None:
        """
        An option is taken by its whole name only: an abbreviation (which
        argparse would expand) is a usage error, in the usage of the command
        it is in, naming the option meant; after --, it is COMMAND's own.
        """
        lock_usage = "usage: jesync lock [options] KEY -- COMMAND [ARGS...]"
        for argv, usage, meant in (
            (["--serv", "db1", "status", "k"], "usage: jesync [-h]", "--server"),
            (["status", "--serv=db1", "k"], "usage: jesync status ", "--server"),
            (["status", "k", "--js"], "usage: jesync status ", "--json"),
            (["lock", "--wai", "3", "k", "--", "true"], lock_usage, "--wait"),
            (["lock", "--no-term", "k", "--", "true"], lock_usage, "--no-terminate-on-loss"),
            (["--conn", "3", "ping"], "usage: jesync [-h]", "--connect-timeout"),
            (["list", "--b", "requests"], "usage: jesync list ", "--by"),
            (["--vers"], "usage: jesync [-h]", "--version"),
        ):
            status, out, err = run_in_process(*argv)
            self.assertEqual((status, out), (2, ""), argv)
            self.assertTrue(err.startswith(usage), (argv, err))
            name = next(word for word in argv if word.startswith("--")).split("=")[0]
            self.assertIn(f"unrecognized arguments: {name} (", err, argv)
            self.assertIn(f"did you mean {meant}?", err, argv)
        self.assertEqual(parse_arguments(["lock", "k", "--", "true", "--wai"]).command, ["true", "--wai"])
        for parser in [build_parser(), *build_parser().commands.values()]:
            self.assertFalse(parser.allow_abbrev, parser.prog)

    def test_exit_statuses_distinct(self) -> None:
        statuses = [EXIT_UNAVAILABLE, EXIT_LOCK_LOST, EXIT_TIMEOUT, EXIT_REFUSED, EXIT_CANNOT_RUN, EXIT_NOT_FOUND, 2]
        statuses.append(EXIT_BUSY)
        self.assertEqual(len(set(statuses)), len(statuses))


class CoordinationArgumentTests(SynchronousTestCase):
    """jesync lock --shared/--value, jesync holders and jesync watch: what is refused before connecting."""

    def test_lock_shared_and_value(self) -> None:
        args = parse_arguments(["lock", "--shared", "--value", "host:80", "k", "--", "true"])
        self.assertEqual((args.shared, args.value), (True, b"host:80"))
        self.assertIsNone(parse_arguments(["lock", "--value", "", "k", "--", "true"]).value)
        status, _, err = run_in_process("lock", "--shared", "-n", "2", "k", "--", "true")
        self.assertEqual(status, 2)
        self.assertIn("--shared takes no --max-concurrent", err)
        status, _, err = run_in_process("lock", "--value", "x" * 9000, "k", "--", "true")
        self.assertEqual(status, 2)
        self.assertIn("a value is at most 4096 bytes", err)

    def test_watch_key_or_prefix(self) -> None:
        self.assertEqual(parse_arguments(["watch", "k"]).key, "k")
        self.assertEqual(parse_arguments(["watch", "--prefix", ""]).prefix, "")
        for argv in (["watch"], ["watch", "k", "--prefix", "p"]):
            status, _, err = run_in_process(*argv)
            self.assertEqual(status, 2, argv)
            self.assertIn("give a KEY or --prefix PREFIX", err)
        status, _, err = run_in_process("holders")
        self.assertEqual(status, 2)
