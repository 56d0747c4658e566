"""
C{jesync}, the command line: run a command while holding a lock (exclusive
or shared, with a value), or while leading an election (C{jesync elect}:
the same runner, over L{jesync.client.Election}), look at a server's
locks, and watch them change (C{jesync elect --observe}: an election's
leader).  Standard library only (plus the blocking client).

C{jesync watch} prints one event per line, flushed at once (so it can be
piped), until interrupted: SIGINT or SIGTERM end it with status 0.  A
dropped connection (a cluster's failover too) ends it with status 69 and a
message: a watch is bound to its connection, and the changes made while
nobody watched would be missing, so it does not silently watch again.
Human form, one line per event (values percent-encoded, as on the wire, so
a line stays one line)::

    granted KEY HOLDER token=T exclusive|shared [value=V]
    released|expired|lost KEY HOLDER token=T
    appeared|disappeared KEY
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Any, Callable, ContextManager, Iterable, Mapping, NamedTuple, Optional, Sequence, TypeVar

from jesync import __version__
from jesync.client import (
    DEFAULT_SERVER,
    AccessRefused,
    Client,
    ConnectionLost,
    Election,
    KeyStatus,
    Leader,
    Lock,
    LockLost,
    LockTimeout,
    ServerError,
    WatchFellBehind,
)
from jesync.client.address import ClusterAddress, parse_servers
from jesync.client.wire import Holder, WatchEvent
from jesync.client.placement import PLACEMENTS
from jesync.client.watch import MAX_EVENTS
from jesync.client.election import CAMPAIGN_EXPIRES, election_key_for
from jesync.client.wire import check_key, check_prefix, lock_value
from jesync.listing import listing_sort_key
from jesync.wire import encode_key, encode_value

# Exit statuses (sysexits.h where one fits).
EXIT_BUSY = 1  # --nonblock and the lock is held: flock -n's status (--conflict-exit-code)
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a server cannot be reached, or the connection dropped
EXIT_LOCK_LOST = 70  # EX_SOFTWARE: the lock was lost while COMMAND ran
EXIT_TIMEOUT = 75  # EX_TEMPFAIL: the wait for the lock timed out (--conflict-exit-code)
EXIT_REFUSED = 76  # EX_PROTOCOL: the server refused the request
EXIT_CONFIG = 78  # EX_CONFIG: the auth token file or a JESYNC_TLS* setting is unusable
EXIT_CANNOT_RUN = 126  # COMMAND is not executable (as in a shell)
EXIT_NOT_FOUND = 127  # COMMAND was not found (as in a shell)
SIGNAL_BASE = 128  # 128+N: killed by (or, before COMMAND ran, interrupted by) signal N

#: The environment variable that gives COMMAND the grant's fencing token.
FENCING_TOKEN_VARIABLE = "JESYNC_FENCING_TOKEN"

#: The environment variable that gives COMMAND the key it runs under (as
#: C{etcdctl lock} gives C{ETCD_LOCK_KEY}).
KEY_VARIABLE = "JESYNC_KEY"

#: The shell that runs C{jesync lock -c STRING}: always this one, as
#: system(3) does (flock -c uses $SHELL).
SHELL = "/bin/sh"

#: What a watch gives C{jesync watch} and C{jesync elect --observe} to print.
Printed = TypeVar("Printed")

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

EXIT_STATUSES = f"""\
exit status:
  jesync lock exits with COMMAND's status (128+N if signal N killed it), or:
    {EXIT_BUSY}      --nonblock and the lock is held, as flock -n (see --conflict-exit-code)
    {EXIT_TIMEOUT}     the wait for the lock timed out (see --conflict-exit-code)
    {EXIT_LOCK_LOST}     the lock was lost while COMMAND ran (its status is printed on stderr)
    {EXIT_NOT_FOUND}    COMMAND was not found ({EXIT_CANNOT_RUN}: not executable); the lock is released
    128+N  jesync was interrupted by signal N while waiting; COMMAND never ran
  every command:
    0      success
    2      bad arguments
    {EXIT_UNAVAILABLE}     a server could not be reached, or the connection dropped
    {EXIT_REFUSED}     the server refused the request (a wrong or missing auth token, or protected mode, too)
    {EXIT_CONFIG}     the auth token file (JESYNC_AUTH_TOKEN_FILE) or a JESYNC_TLS* setting is unusable
"""

MAIN_EXAMPLES = f"""\
examples:
  jesync lock nightly-report -- ./make-report.sh --daily
  jesync lock --nonblock deploy -c './build.sh && ./deploy.sh'   # skip if busy
  jesync --server db1:11400 --server db2:11400 list --by requests
  jesync lock --shared --value "$(hostname)" config -- ./read-config.sh
  jesync holders config
  jesync watch --prefix jobs/ --json
  jesync elect scheduler "$(hostname)" -- ./run-scheduler.sh    # runs while this host leads
  JESYNC_SERVERS=db1,db2 jesync status nightly-report
  JESYNC_SERVERS='a:11400|b:11400|c:11400' jesync lock deploy -- ./deploy.sh
  jesync ping

servers: --server (repeatable, or comma-separated), else $JESYNC_SERVERS
(separated by commas or spaces), else {DEFAULT_SERVER}.  Addresses:
host:port, host (port 11400), [IPv6]:port, unix:/path.  Several servers are
independent, and keys are shared out among them; the members of one jesync
cluster are one server, written a:11400|b:11400|c:11400 (quote the |), and
jesync uses whichever member answers (the leader).

{EXIT_STATUSES}"""

LOCK_DESCRIPTION = """\
Acquire the lock KEY, run COMMAND while holding it (or, with -c, the shell
command line STRING, run by /bin/sh -c), release it when COMMAND exits, and
exit with COMMAND's exit status.

While COMMAND runs the lock is renewed every third of --expires, so a long
command never loses it to the failsafe; if jesync itself dies, the server
releases the lock when the connection closes (or, if the connection hangs,
--expires seconds after the last renewal).  COMMAND runs in the foreground
with jesync's stdin, stdout and stderr.  SIGINT, SIGTERM and SIGHUP sent to
jesync are passed on to COMMAND (a Ctrl-C typed at a terminal already reaches
COMMAND, so it is not sent twice); jesync waits for COMMAND to end and then
releases the lock, however COMMAND ended.

If the lock is lost while COMMAND runs (the server went away or stopped
answering), jesync says so on stderr at once and, after COMMAND ends, exits
with status 70.  COMMAND is left running unless --terminate-on-loss is given,
which sends it SIGTERM.

With the members of a cluster (--server 'a:11400|b:11400|c:11400'), jesync
connects to whichever member answers.  A failover (the leader dies, is
paused or steps down) always loses the lock: it is bound to the connection,
and the new leader soon grants it to another client.  So with a cluster,
--terminate-on-loss is the default: COMMAND gets SIGTERM as soon as the lock
is lost, and jesync exits 70 once it has ended (--no-terminate-on-loss leaves
it running).  A lost lock is noticed when its connection fails or its
renewal (every third of --expires) gets no answer within --read-timeout.

COMMAND gets KEY in $JESYNC_KEY, and the grant's fencing token in
$JESYNC_FENCING_TOKEN: a number larger than that of every earlier grant of
KEY, to pass along with its writes so that whatever it writes to can refuse a
write from an older holder that lost the lock without knowing.  The token is
not set if the server gives no tokens (a server without fencing).

With --shared the lock is a read lock: any number of jesync lock --shared
on KEY hold it at once, never together with an exclusive holder; an
exclusive request waiting for KEY holds back the shared ones that come after
it.  --value V sets a value on the grant (at most 4096 bytes of UTF-8),
which jesync holders KEY and jesync watch show to anyone: say the host
running COMMAND.

Compared with flock(1): -n here is --max-concurrent, the semaphore size;
flock's -n (fail at once, silently, with status 1, if the lock is held) is
--nonblock, which has no short form.  --wait SECONDS gives up after SECONDS
with status 75 and a message (--wait 0: try once), where flock -w exits 1;
-E sets the status for either.  -c always runs /bin/sh, not $SHELL.
"""

LOCK_EXAMPLES = f"""\
examples:
  jesync lock nightly-report -- ./make-report.sh --daily
  jesync lock --wait 10 --conflict-exit-code 0 backup -- rsync -a /data /backup
  jesync lock --nonblock hourly-sync -c 'sync.sh | logger -t sync'   # in cron: skip if busy
  jesync lock --max-concurrent 3 encoder-slots -- ffmpeg -i in.mkv out.mp4
  jesync lock --shared schema -- ./run-queries.sh       # many readers at once
  jesync lock schema -- ./migrate.sh                    # waits for the readers, holds back new ones
  jesync lock --value "$(hostname):8080" leader -- ./serve.sh
  jesync lock deploy -c './deploy.sh --lock "$JESYNC_KEY" --fencing-token "$JESYNC_FENCING_TOKEN"'

{EXIT_STATUSES}"""


WATCH_DESCRIPTION = f"""\
Watch KEY (or, with --prefix, every key that starts with PREFIX; --prefix ''
for every key) and print one line per change of its holders, as it happens,
until interrupted (SIGINT or SIGTERM: exit status 0):

  granted KEY HOLDER token=T exclusive|shared [value=V]
  released KEY HOLDER token=T
  expired KEY HOLDER token=T       its failsafe expiry passed
  lost KEY HOLDER token=T          its connection closed
  appeared KEY                     --prefix only: the key came into use
  disappeared KEY                  --prefix only: nobody holds or waits for it

A value is printed percent-encoded (each byte outside ! to ~, and %, as %XX),
so that an event is always one line.  With --json each line is a JSON object
with kind, key, holder, token, mode and value (null where the event has none;
the value as text, bytes that are not UTF-8 as \\xNN).

If the connection drops (a cluster's failover too), or the output is read so
slowly that {MAX_EVENTS:,} events wait to be printed, jesync says so and exits
{EXIT_UNAVAILABLE}: the changes made until it watches again would be missed, so
it does not watch again on its own; see jesync holders KEY for the state.
"""


ELECT_DESCRIPTION = f"""\
Campaign in the election NAME with VALUE, wait (in the order the candidates
came) until elected, run COMMAND (or, with -c, STRING by /bin/sh -c) while
this process leads, resign when COMMAND exits, and exit with COMMAND's exit
status.  The next candidate is elected at once.

An election NAME is the lock election:NAME: campaigning is an exclusive lock
of it with VALUE, the leader is its holder (jesync holders election:NAME),
and everything jesync lock says holds: the leadership is renewed every third
of --expires, ends when jesync's connection closes, and COMMAND gets
$JESYNC_KEY (election:NAME) and the leadership's fencing token in
$JESYNC_FENCING_TOKEN, larger than every earlier leader's.

If the leadership is lost while COMMAND runs (the server went away or
stopped answering: another candidate may be elected at once), jesync says so
on stderr and sends COMMAND SIGTERM (--no-terminate-on-loss leaves it
running), and exits {EXIT_LOCK_LOST} after it ends.  --wait SECONDS gives up
with status {EXIT_TIMEOUT} if not elected within SECONDS.

With --observe, print who leads (or "no leader"), then each change, one
line each, until interrupted (SIGINT or SIGTERM: status 0); it campaigns
for nothing, so --wait, --expires and --[no-]terminate-on-loss are refused
with it (status 2):

  leader HOLDER token=T [value=V]   (the value percent-encoded)
  no leader

--json prints one object per line: election, leader (null: none), token,
value.  A dropped connection ends it with status {EXIT_UNAVAILABLE}.
"""

ELECT_EXAMPLES = """\
examples:
  jesync elect scheduler "$(hostname)" -- ./run-scheduler.sh
  jesync elect --wait 30 primary-db "$(hostname):5432" -c 'exec ./promote-and-serve.sh'
  jesync elect --observe scheduler
  jesync elect --observe --json scheduler | jq -r .value
"""


class _Interrupted(Exception):
    """A signal arrived while jesync itself was waiting (before COMMAND ran)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(message: str) -> None:
    print(f"jesync: {message}", file=sys.stderr, flush=True)


def printable(key: str) -> str:
    """A key as text that can always be printed (raw bytes shown as \\xNN)."""
    return encode_key(key).decode("utf-8", "backslashreplace")


# -- jesync lock --------------------------------------------------------------


def terminal_signals_child() -> bool:
    """
    Whether a key typed at the terminal (Ctrl-C) signals COMMAND directly:
    the terminal signals its whole foreground process group, and COMMAND is
    in jesync's.
    """
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class SignalRelay:
    """
    jesync's handler for INT, TERM and HUP: before COMMAND starts, they
    interrupt jesync; once it has started, they are passed on to it.
    """

    def __init__(self) -> None:
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.acquiring = True
        self._pending: list[int] = []
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.acquiring:
            raise _Interrupted(signum)
        if self.child is None:
            self._pending.append(signum)  # COMMAND is being started
        else:
            self._forward(signum)

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        pending, self._pending = self._pending, []
        for signum in pending:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        assert self.child is not None
        if signum == signal.SIGINT and terminal_signals_child():
            return
        self.child.send_signal(signum)


def child_environment(lock: Lock) -> dict[str, str]:
    """
    jesync's environment, with the lock's key in L{KEY_VARIABLE} and its
    fencing token in L{FENCING_TOKEN_VARIABLE} (unset if it has none).
    """
    env = dict(os.environ)
    env.pop(FENCING_TOKEN_VARIABLE, None)  # an outer jesync lock's
    env[KEY_VARIABLE] = lock.key
    if lock.token is not None:
        env[FENCING_TOKEN_VARIABLE] = str(lock.token)
    return env


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N if signal N killed it."""
    return SIGNAL_BASE - returncode if returncode < 0 else returncode


def run_lock(args: argparse.Namespace, client: Client) -> int:
    if args.terminate_on_loss is None:
        # A failover loses the lock, and another leader soon grants it to someone else.
        args.terminate_on_loss = isinstance(client.server_for(args.key), ClusterAddress)
    wait = 0 if args.nonblock else args.wait

    def acquire() -> Lock:
        return client.lock(
            args.key, args.max_concurrent, wait, args.expires, auto_renew=True, shared=args.shared, value=args.value
        )

    return run_granted(args, acquire, Holding(f"the lock on {printable(args.key)!r}", "the lock"))


class Holding(NamedTuple):
    """What COMMAND runs under, in jesync's messages: C{what} names it whole, C{noun} short."""

    what: str
    noun: str


def run_granted(args: argparse.Namespace, acquire: Callable[[], Lock], holding: Holding) -> int:
    """
    Wait for C{acquire()} (interrupted by a signal: 128+N; its wait ran
    out: the conflict status), then run COMMAND while holding what it
    granted (L{run_holding}): jesync lock's and jesync elect's runner.
    """
    relay = SignalRelay()
    lock: Optional[Lock] = None
    try:
        lock = acquire()
        relay.acquiring = False
    except _Interrupted as interrupted:
        relay.acquiring = False  # from now on signals are only noted
        if lock is not None:
            lock.release()
        return SIGNAL_BASE + interrupted.signum
    except LockTimeout:
        if not args.nonblock:  # flock -n says nothing (cron mails no output)
            say(f"timed out after waiting {args.wait:g} s for {holding.what}")
        return args.conflict_exit_code
    return run_holding(args, lock, relay, holding)


def run_holding(args: argparse.Namespace, lock: Lock, relay: SignalRelay, holding: Holding) -> int:
    """Run COMMAND while holding C{lock}; release it however COMMAND ends."""
    program = args.program
    what = holding.what

    def lost(error: LockLost) -> None:
        if args.terminate_on_loss:
            say(f"lost {what}: {error.reason}; terminating {program}")
            if relay.child is not None:
                relay.child.terminate()
        else:
            say(f"lost {what}: {error.reason}; {program} keeps running")

    try:
        if not lock.held:
            say(f"lost {what} before {program} started: {lock.lost_reason}")
            return EXIT_LOCK_LOST
        lock.add_lost_callback(lost)
        try:
            child = subprocess.Popen(args.command, env=child_environment(lock))
        except FileNotFoundError:
            say(f"{program}: command not found")
            return EXIT_NOT_FOUND
        except OSError as error:
            say(f"{program}: {error.strerror or error}")
            return EXIT_CANNOT_RUN
        relay.started(child)
        if lock.lost and args.terminate_on_loss:
            child.terminate()
        status = exit_status(child.wait())
    finally:
        released = lock.release()
    if not released:
        say(f"{program} exited with status {status}, but {holding.noun} was lost while it ran")
        return EXIT_LOCK_LOST
    return status


# -- jesync elect -------------------------------------------------------------


def run_elect(args: argparse.Namespace, client: Client) -> int:
    election = Election(client, args.name)
    if args.observe:
        return run_observe(args, election)
    args.nonblock = False
    args.conflict_exit_code = EXIT_TIMEOUT

    def campaign() -> Lock:
        return election.campaign(args.value, args.expires, args.wait).lock

    return run_granted(args, campaign, Holding(f"the leadership of {args.name!r}", "the leadership"))


def leader_text(leader: Optional[Leader]) -> str:
    """A leader as C{jesync elect --observe} prints it for people (the value percent-encoded: one line)."""
    if leader is None:
        return "no leader"
    words = ["leader", leader.peer, f"token={leader.token}"]
    if leader.value is not None:
        words.append("value=" + encode_value(leader.value).decode("ascii"))
    return " ".join(words)


def run_observe(args: argparse.Namespace, election: Election) -> int:
    """Print the leader, then each change, one per line, until interrupted (SIGINT, SIGTERM: status 0)."""

    def line(leader: Optional[Leader]) -> str:
        if not args.json:
            return leader_text(leader)
        row = {"election": args.name, "leader": None, "token": None, "value": None}
        row.update(leader.as_dict() if leader is not None else {})
        return json.dumps(row)

    def fell_behind(error: WatchFellBehind) -> str:
        return (
            f"observing {args.name!r}: the output was read too slowly ({error.max_events} changes waiting):"
            " stopped; observe again"
        )

    return print_until_interrupted(election.observe, line, fell_behind)


# -- jesync status / list / ping --------------------------------------------


def row_dict(row: KeyStatus, server: str) -> dict[str, Any]:
    return {"key": row.key, "granted": row.granted, "waiting": row.waiting, "server": server}


def print_table(rows: list[dict[str, Any]], with_server: bool) -> None:
    columns = ["key", "granted", "waiting"] + (["server"] if with_server else [])
    cells = [[printable(str(row[column])) for column in columns] for row in rows]
    widths = [max([len(column)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)]
    numeric = {"granted", "waiting"}
    for line in [[column.upper() for column in columns]] + cells:
        print(
            "  ".join(
                cell.rjust(width) if column in numeric else cell.ljust(width)
                for column, cell, width in zip(columns, line, widths)
            ).rstrip()
        )


def run_status(args: argparse.Namespace, client: Client) -> int:
    status = client.status(args.key)
    row = row_dict(status, str(client.server_for(args.key)))
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{printable(status.key)}: {status.granted} holding, {status.waiting} waiting ({row['server']})")
    return 0


def holder_dict(holder: Holder) -> dict[str, Any]:
    """A holder as C{jesync holders --json} prints it (the value as text, undecodable bytes as \\xNN)."""
    return {
        "key": printable(holder.key),
        "holder": holder.peer,
        "held_seconds": holder.held_seconds,
        "seconds_left": holder.seconds_left,
        "token": holder.token,
        "mode": holder.mode,
        "value": None if holder.value is None else holder.value.decode("utf-8", "backslashreplace"),
    }


def run_holders(args: argparse.Namespace, client: Client) -> int:
    holders = client.holders(args.key)
    rows = [holder_dict(holder) for holder in holders]
    if args.json:
        print(json.dumps(rows))
        return 0
    columns = ["holder", "held_seconds", "seconds_left", "token", "mode", "value"]
    headings = ["HOLDER", "HELD", "LEFT", "TOKEN", "MODE", "VALUE"]
    cells = [
        [holder.peer, str(holder.held_seconds), str(holder.seconds_left), str(holder.token), holder.mode,
         "" if holder.value is None else encode_value(holder.value).decode("ascii")]
        for holder in holders
    ]
    widths = [max([len(heading)] + [len(line[i]) for line in cells]) for i, heading in enumerate(headings)]
    numeric = {"held_seconds", "seconds_left", "token"}
    for line in [headings] + cells:
        print(
            "  ".join(
                cell.rjust(width) if column in numeric else cell.ljust(width)
                for column, cell, width in zip(columns, line, widths)
            ).rstrip()
        )
    return 0


def event_text(event: WatchEvent) -> str:
    """One event as C{jesync watch} prints it for people (see the module's docstring), not its wire line."""
    words = [event.kind, printable(event.key)]
    if event.holder is not None:
        words += [event.holder, f"token={event.token}"]
    if event.mode is not None:
        words.append(event.mode)
    if event.value is not None:
        words.append("value=" + encode_value(event.value).decode("ascii"))
    return " ".join(words)


def run_watch(args: argparse.Namespace, client: Client) -> int:
    """Print each event, one per line, until interrupted (SIGINT, SIGTERM: status 0)."""

    def line(event: WatchEvent) -> str:
        return json.dumps(event.as_dict()) if args.json else event_text(event)

    def fell_behind(error: WatchFellBehind) -> str:
        what = f"prefix {error.key!r}" if error.prefix else error.key
        return (
            f"the watch of {what}: its output was read too slowly ({error.max_events} events waiting):"
            " stopped; watch again, and see `jesync holders` for the state"
        )

    return print_until_interrupted(lambda: client.watch(args.key, prefix=args.prefix), line, fell_behind)


def print_until_interrupted(
    start: Callable[[], ContextManager[Iterable[Printed]]],
    line: Callable[[Printed], str],
    fell_behind: Callable[[WatchFellBehind], str],
) -> int:
    """
    C{jesync watch}'s and C{jesync elect --observe}'s runner: print C{line}
    of each thing the watch C{start()} opens gives, as it comes (flushed:
    a pipe's reader sees each at once), until interrupted (SIGINT, and
    SIGTERM as a service manager stops it: status 0).  If the output is
    read too slowly (L{WatchFellBehind}), what follows would be missed: say
    C{fell_behind(error)} and exit with EXIT_UNAVAILABLE; a dropped connection
    raises on, to the CLI's own handling.
    """
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with start() as things:
            for thing in things:
                print(line(thing), flush=True)
    except KeyboardInterrupt:
        return 0
    except WatchFellBehind as error:
        say(fell_behind(error))
        return EXIT_UNAVAILABLE
    return 0


def per_server_clients(args: argparse.Namespace) -> list[Client]:
    return [
        Client([address], connect_timeout=args.connect_timeout, read_timeout=args.read_timeout)
        for address in args.servers
    ]


def run_list(args: argparse.Namespace, client: Client) -> int:
    status = 0
    listings: list[tuple[KeyStatus, str]] = []
    for server_client in per_server_clients(args):
        server = str(server_client.servers[0])
        try:
            listings.extend((row, server) for row in server_client.listing(args.by))
        except ConnectionLost as error:
            say(str(error))
            status = EXIT_UNAVAILABLE
        finally:
            server_client.close()
    order = listing_sort_key(args.by)
    listings.sort(key=lambda pair: order(pair[0]))
    rows = [row_dict(row, server) for row, server in listings]
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows, with_server=len(args.servers) > 1)
    return status


def run_ping(args: argparse.Namespace, client: Client) -> int:
    results = []
    status = 0
    for server_client in per_server_clients(args):
        server = str(server_client.servers[0])
        try:
            [seconds] = server_client.ping().values()
            results.append({"server": server, "reachable": True, "rtt_ms": round(seconds * 1000, 3)})
        except ConnectionLost as error:
            results.append({"server": server, "reachable": False, "error": error.reason})
            status = EXIT_UNAVAILABLE
        finally:
            server_client.close()
    if args.json:
        print(json.dumps(results))
    else:
        for result in results:
            if result["reachable"]:
                print(f"{result['server']}: reachable, round trip {result['rtt_ms']:.3f} ms")
            else:
                print(f"{result['server']}: unreachable: {result['error']}")
    return status


# -- arguments -----------------------------------------------------------------


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds, at least 0")
    return value


def positive_integer(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def exit_code(text: str) -> int:
    if not text.isdigit() or int(text) > 255:
        raise argparse.ArgumentTypeError(f"{text!r} is not an exit status (0 to 255)")
    return int(text)


def add_connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """
    The options every command shares.  They are accepted before and after
    the command name; C{default} is C{argparse.SUPPRESS} on the commands, so
    an option given before the command name is not reset by them.
    """
    group = parser.add_argument_group("server options")
    group.add_argument(
        "--server",
        "-s",
        action="append",
        metavar="ADDRESS",
        default=default,
        help=f"a server: host:port, host, [IPv6]:port or unix:/path, or the members of one cluster "
        f"separated by | ('a:11400|b:11400|c:11400': whichever answers); repeat (or separate with commas) "
        f"for several servers [default: $JESYNC_SERVERS, else {DEFAULT_SERVER}]",
    )
    group.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default=default if default is argparse.SUPPRESS else "consistent",
        help="which server a key lives on, with several: consistent hashing, or the JESync PHP "
        "driver's (md5 of the key, modulo the number of servers, in the order given) [default: consistent]",
    )
    group.add_argument(
        "--connect-timeout",
        type=seconds,
        metavar="SECONDS",
        default=default if default is argparse.SUPPRESS else 5.0,
        help="give up connecting after this long [default: 5]",
    )
    group.add_argument(
        "--read-timeout",
        type=seconds,
        metavar="SECONDS",
        default=default if default is argparse.SUPPRESS else 10.0,
        help="give a server up for dead if it does not answer for this long (a lock that waits "
        "is given its --wait plus this long) [default: 10]",
    )


class WholeNameParser(argparse.ArgumentParser):
    """
    A parser that takes options by their whole names only: argparse would
    take C{--serv} for C{--server} and C{--w} for C{--wait}, so an option
    added later (or a typo) would silently change what an existing command
    line means.  An abbreviation is refused with the option meant
    (L{check_whole_names}).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        #: the commands' parsers, by name (jesync's own parser's)
        self.commands: Mapping[str, WholeNameParser] = {}

    def option_names(self) -> list[str]:
        """Every long option name this parser takes."""
        return [name for action in self._actions for name in action.option_strings if name.startswith("--")]


class CommandParser(WholeNameParser):
    """
    A command's parser (C{jesync lock}, ...): every usage error in the
    command's arguments, an unknown option among them, prints the command's
    usage, not jesync's.  (argparse leaves unknown arguments to the top-level
    parser, which would print its own.)
    """

    def parse_known_args(self, args: Optional[Iterable[str]] = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> WholeNameParser:
    """
    The parser.  Each command's parser is also in its namespace, as
    C{command_parser}, for the errors found after parsing.
    """
    formatter = argparse.RawDescriptionHelpFormatter
    parser = WholeNameParser(
        prog="jesync",
        description="Take locks on a JESync lock server from the shell, and look at them.",
        epilog=MAIN_EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"jesync {__version__}", help="print jesync's version and exit"
    )
    add_connection_options(parser, None)
    commands = parser.add_subparsers(
        dest="command_name", metavar="COMMAND", required=True, parser_class=CommandParser
    )

    lock = commands.add_parser(
        "lock",
        help="run a command while holding a lock",
        usage="jesync lock [options] KEY -- COMMAND [ARGS...]\n       jesync lock [options] KEY -c STRING",
        description=LOCK_DESCRIPTION,
        epilog=LOCK_EXAMPLES,
        formatter_class=formatter,
    )
    lock.add_argument("key", metavar="KEY", help="the lock's name (no whitespace)")
    lock.add_argument(
        "command",
        metavar="COMMAND",
        nargs="*",
        default=[],
        help="the command to run, with its arguments: after -- (so that its options stay its own)",
    )
    lock.add_argument(
        "-c",
        "--command",
        dest="shell_command",
        metavar="STRING",
        help="run STRING, a shell command line (pipes, &&, $JESYNC_KEY...), with /bin/sh -c, "
        "as flock -c does; instead of a COMMAND",
    )
    lock.add_argument(
        "--max-concurrent",
        "-n",
        type=positive_integer,
        default=1,
        metavar="N",
        help="a semaphore: up to N holders at once [default: 1, a mutex]",
    )
    waiting = lock.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        "-w",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"give up, with a message and status {EXIT_TIMEOUT}, if the lock is not granted within "
        "SECONDS (whole seconds: a fraction is rounded up); 0 tries once [default: wait for ever]",
    )
    waiting.add_argument(
        "--nonblock",
        action="store_true",
        help=f"flock -n: if the lock is held, do not wait: exit at once with status {EXIT_BUSY} "
        "and no message (--wait 0, with flock's status and silence)",
    )
    lock.add_argument(
        "--expires",
        "-e",
        type=seconds,
        default=120,
        metavar="SECONDS",
        help="the failsafe: the server releases the lock SECONDS after the last renewal if jesync "
        "stops renewing it (0: never) [default: 120]",
    )
    lock.add_argument(
        "--conflict-exit-code",
        "-E",
        type=exit_code,
        default=None,
        metavar="STATUS",
        help=f"exit with STATUS if the wait times out, or, with --nonblock, if the lock is held "
        f"[default: {EXIT_BUSY} with --nonblock, as flock; else {EXIT_TIMEOUT}]",
    )
    lock.add_argument(
        "--shared",
        action="store_true",
        help="a shared (read) lock: held together with other --shared holders of KEY, never with an "
        "exclusive one (not with --max-concurrent)",
    )
    lock.add_argument(
        "--value",
        metavar="V",
        help="a value set on the grant, shown to anyone by jesync holders and jesync watch "
        "(at most 4096 bytes of UTF-8)",
    )
    lock.add_argument(
        "--terminate-on-loss",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send COMMAND SIGTERM if the lock is lost while it runs [default: yes with a cluster's "
        "members (a failover loses the lock), else no: leave it running]",
    )
    add_connection_options(lock, argparse.SUPPRESS)
    lock.set_defaults(command_parser=lock)

    status = commands.add_parser(
        "status",
        help="how many hold a key and how many wait for it",
        description="Show how many clients hold KEY and how many wait for it.",
        epilog='examples:\n  jesync status nightly-report\n  jesync status --json nightly-report\n'
        '  {"key": "nightly-report", "granted": 1, "waiting": 0, "server": "127.0.0.1:11400"}',
        formatter_class=formatter,
    )
    status.add_argument("key", metavar="KEY")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    add_connection_options(status, argparse.SUPPRESS)
    status.set_defaults(command_parser=status)

    listing = commands.add_parser(
        "list",
        help="every key in use",
        description="List every key in use on every server, with its holders and waiters.",
        epilog="examples:\n  jesync list\n  jesync list --by requests      # the most contended first\n"
        "  jesync list --json | jq '.[] | select(.waiting > 0)'",
        formatter_class=formatter,
    )
    listing.add_argument(
        "--by",
        choices=("key", "requests", "grants"),
        default="key",
        help="sort by key, or by waiting (requests) or holding (grants) count, largest first [default: key]",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects")
    add_connection_options(listing, argparse.SUPPRESS)
    listing.set_defaults(command_parser=listing)

    holders = commands.add_parser(
        "holders",
        help="who holds a key: address, times, token, mode and value",
        description="Show who holds KEY: each holder's address, the seconds since it was granted and\n"
        "until its failsafe expiry (0: none), its fencing token, its mode (exclusive or\n"
        "shared) and its value (percent-encoded; in --json, as text, bytes that are not\n"
        "UTF-8 as \\xNN).",
        epilog="examples:\n  jesync holders leader\n  jesync holders --json config | jq '.[].value'",
        formatter_class=formatter,
    )
    holders.add_argument("key", metavar="KEY")
    holders.add_argument("--json", action="store_true", help="print a JSON list of objects")
    add_connection_options(holders, argparse.SUPPRESS)
    holders.set_defaults(command_parser=holders)

    watch = commands.add_parser(
        "watch",
        help="print a key's lock events as they happen",
        usage="jesync watch [options] KEY\n       jesync watch [options] --prefix PREFIX",
        description=WATCH_DESCRIPTION,
        epilog="examples:\n  jesync watch leader\n"
        "  jesync watch --prefix jobs/ --json | jq -c 'select(.kind == \"lost\")'",
        formatter_class=formatter,
    )
    watch.add_argument("key", metavar="KEY", nargs="?", default=None)
    watch.add_argument("--prefix", metavar="PREFIX", help="watch every key that starts with PREFIX, instead of KEY")
    watch.add_argument("--json", action="store_true", help="print one JSON object per line")
    add_connection_options(watch, argparse.SUPPRESS)
    watch.set_defaults(command_parser=watch)

    elect = commands.add_parser(
        "elect",
        help="run a command while this process is an election's leader; or observe the leader",
        usage="jesync elect [options] NAME VALUE -- COMMAND [ARGS...]\n"
        "       jesync elect [options] NAME VALUE -c STRING\n"
        "       jesync elect --observe [--json] NAME",
        description=ELECT_DESCRIPTION,
        epilog=ELECT_EXAMPLES,
        formatter_class=formatter,
    )
    elect.add_argument("name", metavar="NAME", help="the election's name (no whitespace): the key election:NAME")
    elect.add_argument(
        "value", metavar="VALUE", nargs="?", default=None,
        help="this candidate's value, shown to observers (at most 4096 bytes of UTF-8): say its address",
    )
    elect.add_argument(
        "-c",
        "--command",
        dest="shell_command",
        metavar="STRING",
        help="run STRING with /bin/sh -c while leader, instead of a COMMAND after --",
    )
    elect.add_argument(
        "--wait",
        "-w",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"give up, with a message and status {EXIT_TIMEOUT}, if not elected within SECONDS "
        "[default: wait for ever]",
    )
    elect.add_argument(
        "--expires",
        "-e",
        type=seconds,
        default=None,  # (CAMPAIGN_EXPIRES once checked: None says it was not given)
        metavar="SECONDS",
        help="the failsafe: if jesync stops renewing (hung, its connection open), the leadership "
        f"ends SECONDS after the last renewal (0: never) [default: {CAMPAIGN_EXPIRES}]",
    )
    elect.add_argument(
        "--terminate-on-loss",
        action=argparse.BooleanOptionalAction,
        default=None,  # (True once checked: None says it was not given)
        help="send COMMAND SIGTERM if the leadership is lost while it runs [default: yes]",
    )
    elect.add_argument(
        "--observe",
        action="store_true",
        help="print the leader (or 'no leader'), then each change, until interrupted; no VALUE or COMMAND",
    )
    elect.add_argument("--json", action="store_true", help="with --observe: print one JSON object per line")
    add_connection_options(elect, argparse.SUPPRESS)
    elect.set_defaults(command_parser=elect)

    ping = commands.add_parser(
        "ping",
        help="is each server reachable, and how fast does it answer",
        description="Connect to each server and time one request (the round trip, not counting the connection).",
        epilog=f"examples:\n  jesync ping\n  jesync --server 10.0.0.5 ping --json\n\n"
        f"exit status: 0 if every server answered, {EXIT_UNAVAILABLE} if one did not",
        formatter_class=formatter,
    )
    ping.add_argument("--json", action="store_true", help="print a JSON list of objects")
    add_connection_options(ping, argparse.SUPPRESS)
    ping.set_defaults(command_parser=ping)
    parser.commands = commands.choices
    return parser


def check_whole_names(parser: WholeNameParser, argv: Sequence[str]) -> None:
    """
    Refuse (with the usage of the command it is in, and the option meant)
    an option written by a part of its name: C{--serv} for C{--server}.
    Options no name starts with are left to argparse's own error.
    """
    current = parser
    for word in argv:
        if current is parser and word in parser.commands:
            current = parser.commands[word]
            continue
        if not word.startswith("--") or word == "--":
            continue
        name = word.split("=", 1)[0]
        names = current.option_names()
        meant = [option for option in names if option.startswith(name)]
        if name not in names and meant:
            hint = f"options are taken by their whole names: did you mean {' or '.join(meant)}?"
            current.error(f"unrecognized arguments: {name} ({hint})")


def check_elect_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser, command: list[str]) -> None:
    """C{jesync elect}: a VALUE and a COMMAND (or -c), or --observe and neither."""
    try:
        election_key_for(args.name)
    except ValueError as error:
        parser.error(str(error))
    if args.observe:
        if args.value is not None or command or args.shell_command is not None:
            parser.error("--observe takes the election's NAME only: no VALUE, no COMMAND")
        campaigning = {
            "--wait": args.wait,
            "--expires": args.expires,
            "--[no-]terminate-on-loss": args.terminate_on_loss,
        }
        given = [option for option, value in campaigning.items() if value is not None]
        if given:
            parser.error(f"{' and '.join(given)} go with campaigning, not with --observe")
        return
    if args.expires is None:
        args.expires = CAMPAIGN_EXPIRES
    if args.terminate_on_loss is None:
        args.terminate_on_loss = True
    if args.json:
        parser.error("--json goes with --observe")
    if args.value is None:
        parser.error("a VALUE is needed: jesync elect NAME VALUE -- COMMAND [ARGS...] (or --observe NAME)")
    if args.shell_command is not None:
        if command:
            parser.error("give -c STRING or a COMMAND after --, not both")
        args.command = [SHELL, "-c", args.shell_command]
        args.program = "the -c command"
    elif not command:
        parser.error("a COMMAND to run is needed: jesync elect NAME VALUE -- COMMAND [ARGS...], or -c STRING")
    else:
        args.command = command
        args.program = command[0]
    try:
        args.value = lock_value(election_key_for(args.name), os.fsencode(args.value), False)
    except ValueError as error:
        parser.error(str(error))


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """
    Parse; COMMAND is everything after the first C{--} (so its own options
    stay its own).  A usage error prints the usage of the command it is in.
    """
    parser = build_parser()
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    check_whole_names(parser, argv)
    args = parser.parse_args(argv)
    command_parser: argparse.ArgumentParser = args.command_parser
    if args.command_name == "lock":
        args.command = args.command + command
        if args.shell_command is not None:
            if args.command:
                command_parser.error("give -c STRING or a COMMAND after KEY, not both")
            args.command = [SHELL, "-c", args.shell_command]
            args.program = "the -c command"
        elif not args.command:
            command_parser.error("a COMMAND to run is needed: jesync lock KEY -- COMMAND [ARGS...], or -c STRING")
        else:
            args.program = args.command[0]
        if args.conflict_exit_code is None:
            args.conflict_exit_code = EXIT_BUSY if args.nonblock else EXIT_TIMEOUT
        if args.shared and args.max_concurrent != 1:
            command_parser.error("--shared takes no --max-concurrent: any number of shared holders share the lock")
    elif args.command_name == "elect":
        check_elect_arguments(args, command_parser, command)
    elif args.command_name == "watch" and (args.key is None) == (args.prefix is None):
        command_parser.error("give a KEY or --prefix PREFIX (--prefix '' for every key), not both")
    elif command:
        command_parser.error(f"jesync {args.command_name} takes no command after --")
    try:
        args.servers = parse_servers(",".join(args.server or []) or os.environ.get("JESYNC_SERVERS") or DEFAULT_SERVER)
        if args.command_name in ("lock", "status", "holders") or args.command_name == "watch" and args.key:
            check_key(args.key)
        if args.command_name == "lock" and args.value is not None:
            # The bytes given (os.fsencode: as the shell passed them, even if not UTF-8).
            args.value = lock_value(args.key, os.fsencode(args.value), args.shared)
        if args.command_name == "watch" and args.prefix:
            check_prefix(args.prefix)
    except ValueError as error:
        command_parser.error(str(error))
    return args


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], int]] = {
    "lock": run_lock,
    "status": run_status,
    "list": run_list,
    "ping": run_ping,
    "holders": run_holders,
    "watch": run_watch,
    "elect": run_elect,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The C{jesync} console script; returns the exit status."""
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    try:
        client = Client(
            args.servers,
            placement=args.placement,
            connect_timeout=args.connect_timeout,
            read_timeout=args.read_timeout,
        )
    except ValueError as error:  # the token file, or a JESYNC_TLS* variable
        say(str(error))
        return EXIT_CONFIG
    try:
        return COMMANDS[args.command_name](args, client)
    except ConnectionLost as error:
        say(str(error))
        return EXIT_UNAVAILABLE
    except AccessRefused as error:  # protected mode, a wrong or missing token: the server's words
        say(str(error))
        return EXIT_REFUSED
    except ServerError as error:
        say(f"the server refused the request: {error.message}")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return SIGNAL_BASE + signal.SIGINT
    except BrokenPipeError:
        # Output piped to a command that stopped reading (jesync list | head).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
