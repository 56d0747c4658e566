"""
C{twistd jesync}: its options (L{jesync.tap}), the plugin that makes it a
twistd subcommand, and the real thing, run as a subprocess of the checkout.
"""

from __future__ import annotations

import io
import os
import re
import sys

import twisted
from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IServiceMaker, MultiService
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    UNIXClientEndpoint,
    UNIXServerEndpoint,
    connectProtocol,
)
from twisted.internet.error import ConnectionDone, ProcessDone
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase

from jesync import __version__, tap
from jesync.protocols.jesync import JESyncFactory
from jesync.service import LockService
from tests.support import TIMEOUT, ConnectionTracker, LineClient, parse, short_temp_dir
from tests.twistd_process import REPOSITORY, TwistdTestCase, assert_usage_error_status


class OptionsTests(SynchronousTestCase):
    def test_default_port(self) -> None:
        options = parse()
        self.assertEqual(options["ports"], ["tcp:11400"])
        self.assertFalse(options["verbose"])

    def test_port_number_means_tcp(self) -> None:
        self.assertEqual(parse("--port", "7777")["ports"], ["tcp:7777"])
        self.assertEqual(parse("--port=7777")["ports"], ["tcp:7777"])
        self.assertEqual(parse("-p", "7777")["ports"], ["tcp:7777"])

    def test_repeated_port(self) -> None:
        options = parse("--port", "7777", "-p", "unix:/run/jesync.sock", "--port", "tcp:7778:interface=127.0.0.1")
        self.assertEqual(options["ports"], ["tcp:7777", "unix:/run/jesync.sock", "tcp:7778:interface=127.0.0.1"])

    def test_descriptions_pass_through(self) -> None:
        for description in [
            "tcp:7777:interface=127.0.0.1",
            "tcp6:7777:interface=\\:\\:1",
            "unix:/run/jesync.sock:mode=660",
            "tcp:port=7777:backlog=100",
        ]:
            self.assertEqual(parse("--port", description)["ports"], [description])

    def test_invalid_description(self) -> None:
        for value in ["bogus:1", "tcp:notaport", "", "tcp:7777:nosuchoption=1", "unix"]:
            error = self.assertRaises(usage.UsageError, parse, "--port", value)
            self.assertTrue(str(error).startswith(f"--port {value}: "), str(error))

    def test_verbose(self) -> None:
        self.assertTrue(parse("--verbose")["verbose"])
        self.assertTrue(parse("-v")["verbose"])

    def test_unknown_option(self) -> None:
        self.assertRaises(usage.UsageError, parse, "--nope")
        self.assertRaises(usage.UsageError, parse, "extra")

    def test_errors_name_the_option(self) -> None:
        for argv, message in [
            (["--max-keys=-1"], "--max-keys -1: must be 0 (no limit) or more"),
            (["--max-keys", "many"], "--max-keys many: not a whole number"),
            (["--keepalive", "soon"], "--keepalive soon: not a number of seconds"),
            (["--shutdown-grace=-1"], "--shutdown-grace -1: must not be negative"),
            (["--memcache-memory", "12q"], "--memcache-memory 12q: not a size (65536, 64k, 64m, 1g)"),
            (["--dlock-max-keys", "x"], "--dlock-max-keys x: not a whole number"),
        ]:
            error = self.assertRaises(usage.UsageError, parse, *argv)
            self.assertEqual(str(error), message)

    def test_errors_under_twistd_are_brief(self) -> None:
        """Under twistd, an option error exits with the error and a hint (twistd would print the whole --help)."""
        from twisted.scripts.twistd import ServerOptions

        error = self.assertRaises(SystemExit, ServerOptions().parseOptions, ["jesync", "--max-keys=-1"])
        self.assertEqual(error.code, "twistd jesync: --max-keys -1: must be 0 (no limit) or more\n" + tap.HELP_HINT)
        self.assertEqual(tap.HELP_HINT, "Run 'twistd jesync --help' for the options.")
        # and the options parse as ever
        options = ServerOptions()
        options.parseOptions(["jesync", "--max-keys=7"])
        self.assertEqual(options.subOptions["max-keys"], 7)

    def test_usage_shows_examples(self) -> None:
        text = tap.Options().getUsage(width=80)
        self.assertIn("--port=", text)
        self.assertIn("--verbose", text)
        self.assertIn("twistd -n jesync --port 7777\n", text)


def help_sections(options: tap.Options) -> list[tuple[str, dict[str, str]]]:
    """
    C{options}' --help, wide enough not to wrap, as its sections in order:
    each title, and the options in it (whole name: description).
    """
    sections: list[tuple[str, dict[str, str]]] = []
    for line in options.getUsage(width=500).splitlines():
        if re.fullmatch(r"[A-Z][a-z]+:", line):
            sections.append((line[:-1], {}))
            continue
        row = re.fullmatch(r"  (?:-\w, |    )--([a-z-]+)=? +(.*)", line)
        if row:
            rows = sections[-1][1]
            assert row.group(1) not in rows, f"listed twice: {line}"
            rows[row.group(1)] = row.group(2)
    return sections


class HelpTests(SynchronousTestCase):
    """--help: the options in groups, each once, with defaults that can be typed back."""

    def test_groups_in_order(self) -> None:
        sections = help_sections(tap.Options())
        self.assertEqual(
            [title for title, _ in sections], ["Listeners", "Limits", "Security", "Cluster", "Operations", "Examples"]
        )
        groups = dict(sections)
        self.assertEqual(list(groups["Listeners"])[0], "port")
        self.assertEqual(
            list(groups["Listeners"]),
            ["port", "elock-port", "dlock-port", "memcache-port", "admin-port", "metrics", "http-port"],
        )
        self.assertIn("max-keys", groups["Limits"])
        self.assertIn("memcache-memory", groups["Limits"])
        self.assertEqual(
            list(groups["Security"]),
            [
                "auth-token-file",
                "auth-token-grace",
                "admin-token-file",
                "auth-timeout",
                "protected-mode",
                "tls-ciphers",
                "tls-min-version",
                "metrics-public",
            ],
        )
        self.assertEqual(list(groups["Cluster"]), ["etcd", "cluster", "lease-ttl"])
        self.assertEqual(list(groups["Operations"])[-3:], ["verbose", "version", "help"])
        self.assertEqual(groups["Examples"], {})

    def test_every_option_once(self) -> None:
        options = tap.Options()
        listed = [name for _, names in help_sections(options) for name in names]
        self.assertEqual(sorted(listed), sorted(options.whole_names()))
        self.assertEqual(len(listed), len(set(listed)))
        # the short forms are shown with their options
        self.assertIn("  -p, --port=", options.getUsage(width=80))
        self.assertIn("  -v, --verbose ", options.getUsage(width=80))

    def test_groups_must_name_every_option(self) -> None:
        """An option left out of the groups (or named in two) is the code's mistake, found at once."""

        class Forgotten(tap.Options):
            optParameters = [["new-limit", None, 1, "A limit added without a group.", tap.limit]]

        error = self.assertRaises(TypeError, Forgotten)
        self.assertEqual(str(error), "Options.groups: options in no group: ['new-limit']; unknown or in two: []")

        class Twice(tap.Options):
            groups = (*tap.Options.groups, ("More", ("port", "no-such")))

        error = self.assertRaises(TypeError, Twice)
        self.assertEqual(str(error), "Options.groups: options in no group: []; unknown or in two: ['no-such', 'port']")

    def test_defaults_as_typed(self) -> None:
        rows = {name: text for _, names in help_sections(tap.Options()) for name, text in names.items()}
        for name, shown in [
            ("memcache-memory", "64m"),
            ("memcache-max-item", "1m"),
            ("keepalive", "60"),
            ("idle-timeout", "0"),
            ("auth-token-grace", "300"),
            ("shutdown-grace", "5"),
            ("max-unsent", "4194304"),  # a whole number of bytes: the option takes no unit
            ("protected-mode", "on"),
            ("port", "11400"),
        ]:
            self.assertTrue(rows[name].endswith(f" [default: {shown}]"), (name, rows[name]))
        self.assertNotIn("[default:", rows["auth-token-file"])
        self.assertNotIn("[default:", rows["verbose"])
        # Every default shown, typed back, is the default.
        defaults = parse()
        typed_back = 0
        for name, text in rows.items():
            shown = re.search(r" \[default: ([^\]]+)\]$", text)
            if shown and name in defaults:
                typed_back += 1
                self.assertEqual(parse(f"--{name}={shown.group(1)}")[name], defaults[name], name)
                self.assertEqual(parse(f"--{name}", shown.group(1))[name], defaults[name], name)
        self.assertGreaterEqual(typed_back, 20)

    def test_sizes_and_seconds_read_back(self) -> None:
        for value, text in [(64 * 1024**2, "64m"), (1024**3, "1g"), (1536, "1536"), (512 * 1024, "512k"), (1, "1")]:
            self.assertEqual(tap.size_text(value), text)
            self.assertEqual(tap.size(text), value)
        for number, text in [(60.0, "60"), (0.0, "0"), (0.25, "0.25"), (1234567.0, "1234567")]:
            self.assertEqual(tap.seconds_text(number), text)
            self.assertEqual(tap.seconds(text), number)


class VersionTests(SynchronousTestCase):
    def test_version(self) -> None:
        """--version names jesync's version first, then Twisted's, and exits with status 0."""
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        error = self.assertRaises(SystemExit, parse, "--version")
        self.assertEqual(error.code, 0)
        self.assertEqual(out.getvalue(), tap.version_text() + "\n")
        self.assertTrue(out.getvalue().startswith(f"jesync {__version__} (Twisted {twisted.__version__}, "))
        self.assertRegex(out.getvalue(), r"^jesync \S+ \(Twisted \S+, (CPython|PyPy) 3\.\d+\.\d+\S*\)\n$")


class WholeNameTests(SynchronousTestCase):
    """Long options only by their whole names: getopt would take any unambiguous prefix."""

    def refused(self, *argv: str) -> list[str]:
        return str(self.assertRaises(usage.UsageError, parse, *argv)).split("\n")

    def test_abbreviation_refused_with_suggestion(self) -> None:
        for argv, name, suggestion in [
            (["--por", "7777"], "por", "--port"),
            (["--por=7777"], "por", "--port"),
            (["--prot", "7777"], "prot", "--protected-mode or --port"),
            (["--verb"], "verb", "--verbose"),
            (["--vers"], "vers", "--version"),
            (["--max-key", "5"], "max-key", "--max-key-length or --max-keys"),
            (["-v", "--port", "7777", "--memcache-mem=1g"], "memcache-mem", "--memcache-memory or --memcache-max-item"),
        ]:
            self.assertEqual(
                self.refused(*argv),
                [f"unknown option --{name} (options are given by their whole names)", f"Did you mean {suggestion}?"],
                argv,
            )

    def test_misspelling_gets_a_suggestion(self) -> None:
        self.assertEqual(
            self.refused("--max-conections=5"), ["unknown option --max-conections", "Did you mean --max-connections?"]
        )
        self.assertEqual(self.refused("--stat-dir", "/tmp"), ["unknown option --stat-dir", "Did you mean --state-dir?"])
        self.assertEqual(self.refused("--nope"), ["unknown option --nope"])

    def test_whole_names_in_every_form(self) -> None:
        for argv in [["--port", "7777"], ["--port=7777"], ["-p", "7777"], ["-p7777"], ["-vp", "7777"], ["-vp7777"]]:
            self.assertEqual(parse(*argv)["ports"], ["tcp:7777"], argv)
        self.assertEqual(parse("--memcache-memory", "1g", "--verbose")["memcache-memory"], 1024**3)

    def test_values_are_not_options(self) -> None:
        """A value that looks like an option is the value (as getopt takes it), not an abbreviation."""
        for argv in [["--auth-token-file", "--por"], ["-v", "--auth-token-file", "--por"]]:
            (line,) = self.refused(*argv)
            self.assertTrue(line.startswith("--auth-token-file: cannot read --por: "), line)
        # after "--" or a non-option, getopt reads no more options: nor does the check
        self.assertEqual(self.refused("--", "--por"), ["Wrong number of arguments."])
        self.assertEqual(self.refused("extra", "--por"), ["Wrong number of arguments."])

    def test_under_twistd(self) -> None:
        """The refusal, its suggestion and the hint; twistd's own options, before jesync, are twistd's business."""
        from twisted.scripts.twistd import ServerOptions

        error = self.assertRaises(SystemExit, ServerOptions().parseOptions, ["--nodaemon", "jesync", "--por", "7777"])
        self.assertEqual(
            error.code,
            "twistd jesync: unknown option --por (options are given by their whole names)\n"
            "Did you mean --port?\n" + tap.HELP_HINT,
        )
        options = ServerOptions()
        options.parseOptions(["--nodaemon", "--pidfile=", "jesync", "--port=7777", "-v"])
        self.assertEqual((options["nodaemon"], options["pidfile"]), (True, ""))
        self.assertEqual(options.subOptions["ports"], ["tcp:7777"])


class ReadmeTests(SynchronousTestCase):
    """What docs/operating.md's "Running it" says twistd jesync prints is what it prints."""

    def setUp(self) -> None:
        with open(os.path.join(REPOSITORY, "docs", "operating.md"), encoding="utf-8") as file:
            self.text = " ".join(file.read().split())

    def test_refusal(self) -> None:
        lines = str(self.assertRaises(usage.UsageError, parse, "--por", "7777")).split("\n")
        self.assertIn("`--por 7777` is refused (`unknown option --por`, then `Did you mean --port?`)", self.text)
        self.assertTrue(lines[0].startswith("unknown option --por"), lines)
        self.assertEqual(lines[1], "Did you mean --port?")

    def test_version(self) -> None:
        shown = re.search(r"`twistd jesync --version` prints .*?\(`(jesync [^`]*)`\)", self.text)
        assert shown is not None
        pattern = r"jesync (\S+) \(Twisted \S+, (?:CPython|PyPy) 3\.\d+\.\d+\S*\)"
        example = re.fullmatch(pattern, shown.group(1))
        assert example is not None, shown.group(1)
        self.assertEqual(example.group(1), __version__)
        self.assertRegex(tap.version_text(), "^" + pattern + "$")

    def test_groups(self) -> None:
        titles = [title.lower() for title, _ in tap.Options.groups]
        self.assertIn(f"in groups: {', '.join(titles)};", self.text)


class MakeServiceTests(SynchronousTestCase):
    def test_one_listening_service_per_port(self) -> None:
        server = tap.makeService(parse("--port", "7777", "--port", "tcp:7778:interface=127.0.0.1", "-p", "unix:/run/j.sock"))
        self.assertIsInstance(server, MultiService)
        children = list(server)
        self.assertEqual(len(children), 3)
        for child in children:
            self.assertIsInstance(child, StreamServerEndpointService)
            self.assertFalse(child.running)
        tcp, tcp_local, unix = (child.endpoint for child in children)
        self.assertIsInstance(tcp, TCP4ServerEndpoint)
        self.assertEqual((tcp._port, tcp._interface), (7777, ""))
        self.assertIsInstance(tcp_local, TCP4ServerEndpoint)
        self.assertEqual((tcp_local._port, tcp_local._interface), (7778, "127.0.0.1"))
        self.assertIsInstance(unix, UNIXServerEndpoint)
        self.assertEqual(unix._address, "/run/j.sock")
        # one factory, one lock table, behind every port
        factories = {id(child.factory) for child in children}
        self.assertEqual(len(factories), 1)
        factory = children[0].factory
        self.assertIsInstance(factory, JESyncFactory)
        self.assertIsInstance(factory.service, LockService)
        self.assertFalse(factory.verbose)

    def test_default_service(self) -> None:
        (child,) = tap.makeService(parse())
        self.assertEqual((child.endpoint._port, child.endpoint._interface), (11400, ""))

    def test_verbose_factory(self) -> None:
        (child,) = tap.makeService(parse("--verbose", "--port", "7777"))
        self.assertTrue(child.factory.verbose)


class PluginTests(SynchronousTestCase):
    def test_discovered(self) -> None:
        makers = [maker for maker in getPlugins(IServiceMaker) if maker.tapname == "jesync"]
        self.assertEqual(len(makers), 1)
        (maker,) = makers
        self.assertIs(maker.options, tap.Options)
        self.assertIs(maker.makeService, tap.makeService)
        self.assertEqual(maker.description, "A JESync-compatible lock server (mutexes and counting semaphores).")


class StartedServiceTests(TestCase):
    """The service makeService builds, started in this process."""

    timeout = 30

    @inlineCallbacks
    def test_every_port_serves_one_lock_table(self):
        directory = short_temp_dir(self)
        paths = [os.path.join(directory, name) for name in ("a.sock", "b.sock")]
        server = tap.makeService(parse("--port", f"unix:{paths[0]}", "--port", f"unix:{paths[1]}"))
        (factory,) = {child.factory for child in server}
        tracker = ConnectionTracker(factory)
        server.startService()
        clients = []
        self.addCleanup(server.stopService)
        self.addCleanup(lambda: tracker.close_all(clients))
        for path in paths:
            client = yield connectProtocol(UNIXClientEndpoint(reactor, path), LineClient()).addTimeout(TIMEOUT, reactor)
            clients.append(client)
        first, second = clients
        self.assertEqual((yield first.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield second.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")
        yield first.disconnect()
        self.assertEqual((yield second.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield second.ask(b"release k\n")), b"RELEASED 0 0 k\n")
        self.assertEqual(factory.service.listing(), [])


class TwistdTests(TwistdTestCase):
    """C{twistd -n jesync} as a real subprocess, with the checkout on its path."""

    timeout = 60

    @inlineCallbacks
    def test_example_tac_file(self):
        """etc/jesync.tac runs under twistd -y and serves JESync on JESYNC_PORT."""
        tac = os.path.join(REPOSITORY, "etc", "jesync.tac")
        process = self.spawn("-n", "--pidfile=", "-y", tac, JESYNC_PORT="tcp:0:interface=127.0.0.1")
        match = yield process.wait_for(rb"JESyncFactory starting on (\d+)\n")
        client = yield self.connect(TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1))))
        self.assertEqual((yield client.ask(b"lock k 2\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield client.ask(b"status-by-key\n", 2)), b"STATUS 1 0 k\nEND\n")
        yield client.disconnect()
        yield self.terminate(process)

    @inlineCallbacks
    def test_tcp(self):
        process = self.run_server("--port", "tcp:0:interface=127.0.0.1")
        match = yield process.wait_for(rb"JESyncFactory starting on (\d+)\n")
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1)))
        holder = yield self.connect(endpoint)
        waiter = yield self.connect(endpoint)
        peers = [b"127.0.0.1:%d" % client.transport.getHost().port for client in (holder, waiter)]
        self.assertEqual((yield holder.ask(b"lock k\n")), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield waiter.ask(b"lock k\nstatus k\nbogus\n", 2)), b"STATUS 1 1 k\nINVALID_COMMAND\n")
        holder.send(b"quit\n")
        self.assertIsInstance((yield holder.wait_closed()), ConnectionDone)
        self.assertEqual((yield waiter.read_line()), b"GRANTED 1 0 k 120\n")
        self.assertEqual((yield waiter.ask(b"status-by-key\n", 2)), b"STATUS 1 0 k\nEND\n")
        yield waiter.disconnect()
        yield process.wait_for(rb"disconnected\n", count=2)
        yield self.terminate(process)

        for peer in peers:
            self.assertEqual(len(process.log_lines(re.escape(peer) + rb" connected$")), 1, process.text())
            self.assertEqual(len(process.log_lines(re.escape(peer) + rb" disconnected$")), 1, process.text())
        self.assertEqual(len(process.log_lines(rb"#info\] .* connected$")), 2, process.text())
        self.assertEqual(len(process.log_lines(rb"#info\] .* disconnected$")), 2, process.text())
        # nothing per command without --verbose
        self.assertEqual(process.log_lines(rb"JESyncProtocol#(?!info)|sent b'|answered b'"), [], process.text())

    @inlineCallbacks
    def test_unix_verbose(self):
        process = self.run_server("--verbose", "--port", "unix:jesync.sock")
        yield process.wait_for(rb"JESyncFactory starting on '.*jesync\.sock'\n")
        path = os.path.join(process.directory, "jesync.sock")
        client = yield self.connect(UNIXClientEndpoint(reactor, path), retry=True)
        self.assertEqual(
            (yield client.ask(b"lock k\nnope\nstatus-by-key\n", 4)),
            b"GRANTED 1 0 k 120\nINVALID_COMMAND\nSTATUS 1 0 k\nEND\n",
        )
        client.send(b"quit\n")
        yield client.wait_closed()
        yield process.wait_for(rb"disconnected\n")
        yield self.terminate(process)

        debug = [line.split(b"] ", 1)[1] for line in process.log_lines(rb"JESyncProtocol#debug\]")]
        self.assertEqual(
            debug,
            [
                b"unix: sent b'lock k'",
                b"unix: answered b'GRANTED 1 0 k 120'",
                b"unix: sent b'nope'",
                b"unix: answered b'INVALID_COMMAND'",
                b"unix: sent b'status-by-key'",
                b"unix: answered b'STATUS 1 0 k'",
                b"unix: answered b'END'",
                b"unix: sent b'quit'",
            ],
        )
        self.assertEqual(len(process.log_lines(rb"JESyncProtocol#info\] unix: connected$")), 1, process.text())
        self.assertEqual(len(process.log_lines(rb"JESyncProtocol#info\] unix: disconnected$")), 1, process.text())

    @inlineCallbacks
    def test_tcp_and_unix_share_locks(self):
        process = self.run_server("--port", "tcp:0:interface=127.0.0.1", "--port", "unix:j.sock")
        match = yield process.wait_for(rb"JESyncFactory starting on (\d+)\n")
        yield process.wait_for(rb"JESyncFactory starting on '.*j\.sock'\n")
        over_tcp = yield self.connect(TCP4ClientEndpoint(reactor, "127.0.0.1", int(match.group(1))))
        over_unix = yield self.connect(UNIXClientEndpoint(reactor, os.path.join(process.directory, "j.sock")), retry=True)
        self.assertEqual((yield over_tcp.ask(b"lock k 1 -1 0\n")), b"GRANTED 1 0 k 0\n")
        self.assertEqual((yield over_unix.ask(b"lock k 1 0\n")), b"TIMEOUT 1 0 k\n")
        # A client still connected at shutdown does not stop a clean exit.
        yield self.terminate(process)
        yield over_tcp.wait_closed()
        yield over_unix.wait_closed()

    @inlineCallbacks
    def test_elock_and_jesync_share_locks(self):
        process = self.run_server("--port", "tcp:0:interface=127.0.0.1", "--elock-port", "tcp:0:interface=127.0.0.1")
        jesync_port = yield process.wait_for(rb"JESyncFactory starting on (\d+)\n")
        elock_port = yield process.wait_for(rb"ELockFactory starting on (\d+)\n")
        jesync_endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", int(jesync_port.group(1)))
        elock_endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", int(elock_port.group(1)))
        elock = yield self.connect(elock_endpoint)
        jesync = yield self.connect(jesync_endpoint)
        self.assertEqual((yield elock.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        self.assertEqual((yield jesync.ask(b"status k\nlock k 1 0\n", 2)), b"STATUS 1 0 k\nTIMEOUT 1 0 k\n")
        self.assertEqual((yield jesync.ask(b"lock k\nstatus k\n")), b"STATUS 1 1 k\n")
        self.assertEqual(
            (yield elock.ask(b"stats\r\nbogus\r\n", 6)),
            b"200 STATS\r\nSTAT clients 1\r\nSTAT locks 1\r\nSTAT monitoring 0\r\nEND\r\n"
            b'400 Unknown command: "bogus"\r\n',
        )
        # quitting ends the session: the lock goes to the JESync waiter at once
        elock.send(b"quit\r\n")
        self.assertEqual((yield elock.read_line()), b"200 Hey, it was nice seeing you.\r\n")
        self.assertIsInstance((yield elock.wait_closed()), ConnectionDone)
        self.assertEqual((yield jesync.read_line()), b"GRANTED 1 0 k 120\n")
        # and the reverse: a JESync holder keeps elock clients out
        other = yield self.connect(elock_endpoint)
        self.assertEqual((yield other.ask(b"lock k\r\n")), b"409 Unavailable\r\n")
        self.assertEqual((yield jesync.ask(b"release k\n")), b"RELEASED 0 0 k\n")
        self.assertEqual((yield other.ask(b"lock k\r\n")), b"200 Acquired\r\n")
        yield self.terminate(process)

        self.assertEqual(len(process.log_lines(rb"ELockProtocol#info\] .* connected$")), 2, process.text())
        self.assertEqual(len(process.log_lines(rb"JESyncProtocol#info\] .* connected$")), 1, process.text())

    @inlineCallbacks
    def test_bad_port_is_a_usage_error(self):
        """The error and a hint on stderr, not the whole --help."""
        process = self.run_server("--port", "bogus:1")
        assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: --port bogus:1: Unknown endpoint type: 'bogus'\n" + tap.HELP_HINT.encode() + b"\n",
        )
        self.assertNotIn(b"--max-keys", process.output)

    @inlineCallbacks
    def test_version(self):
        process = self.spawn("jesync", "--version")
        self.assertIsInstance((yield process.wait_ended()), ProcessDone)
        self.assertEqual(process.output, tap.version_text().encode() + b"\n")

    @inlineCallbacks
    def test_abbreviated_option_refused(self):
        """--por is not --port: the error, a suggestion and the hint, status 1, and no server."""
        process = self.run_server("--por", "0")
        assert_usage_error_status(self, (yield process.wait_ended()))
        self.assertEqual(
            process.errors,
            b"twistd jesync: unknown option --por (options are given by their whole names)\n"
            b"Did you mean --port?\n" + tap.HELP_HINT.encode() + b"\n",
        )
        self.assertEqual(process.output, process.errors)

    @inlineCallbacks
    def test_help_is_whole(self):
        process = self.spawn("jesync", "--help")
        self.assertIsInstance((yield process.wait_ended()), ProcessDone)
        for text in [b"Usage: twistd [options] jesync [options]", b"--max-keys=", b"--port=", b"Examples:"]:
            self.assertIn(text, process.output)

    @inlineCallbacks
    def test_listed_by_twistd(self):
        process = self.spawn("--help")
        reason = yield process.wait_ended()
        self.assertIsInstance(reason, ProcessDone)
        self.assertRegex(process.output, rb"\n    jesync +A JESync-compatible lock server")
