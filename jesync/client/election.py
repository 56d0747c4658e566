"""
Leader elections, in the style of etcd's C{concurrency.Election}: a small
object over a client, built on the lock table's own primitives, with no
election code in the server.

The rules (docs/coordination.md, "Elections", says them to users):

 - An election C{E} is the key C{election:E} (L{jesync.wire.election_key}).
 - Campaigning is an exclusive C{lock} of that key with the candidate's
   value, waiting: candidates queue in arrival order, and the server grants
   the key to the first when the leader goes.  The leader is its holder;
   its grant's fencing token is the leadership's token (each leader's is
   larger than every earlier one's), to pass along with the leader's writes
   so that a deposed leader's are refused downstream.
 - The connection owns liveness, as an etcd session does: leadership ends
   when the leader resigns (a C{release}: the next candidate is granted at
   once), when its connection closes, or when its failsafe expiry runs out
   (a leader renews itself every third of C{expires}).  A leader is always
   told it lost the leadership (its L{Leadership} is C{lost}, its lost
   callbacks are called, leaving a C{with} block raises L{LockLost}): never
   silence.
 - Observing is watching the key, then asking its C{holders}: the
   consistent start.  The observer is told the leader then (or None: no
   leader), and again on every change: a new leader (C{granted}), or none
   (its leader released, expired or lost).  The C{holders} answer itself
   divides the watch's events: the server writes an event to a connection
   before its reply to any request made after the event, and a client
   handles the lines it reads in order, so when the answer is handled (in
   the connection's reader: L{holders_marking}) the watch has been handed
   exactly the events from before it, which the answer already counts.
   Those are skipped; every later one is applied.

A leadership bound to one connection ends with it; C{keep_campaigning}
(L{Candidacy}) campaigns again after each loss, in etcd's style (the
session owns liveness, the application is told): the loss is told
(C{on_lost}) before it queues again, and C{on_elected} when it leads again.

Anyone may also lock C{election:E} by hand (it is a key like any other):
the election sees that holder as its leader; held shared by several, the
first of them in grant order (L{leader_of}, L{LeaderTracker}).  This module has the blocking
and the asyncio elections; the Twisted one is L{jesync.client.txclient}'s
C{TwistedElection}, over the same L{Leader}, L{LeaderTracker} and
L{Leadership}.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, NamedTuple, Optional, TypeVar

from jesync.client.errors import ClientError, LockLost, describe
from jesync.client.handle import LockState, LostCallback
from jesync.client.keeping import Kept, KeptInThread
from jesync.client.watch import MAX_EVENTS, Request
from jesync.client.wire import HOLDER_EVENTS, Holder, WatchEvent, check_key, check_value
from jesync.wire import GRANTED, election_key

if TYPE_CHECKING:
    from jesync.client.aio import AsyncClient, AsyncLock, AsyncWatch
    from jesync.client.blocking import Client, Lock, Watch

log = logging.getLogger("jesync.client")

#: A leader's failsafe expiry, by default, in seconds: how long a leader that
#: hangs with its connection open stays leader (it renews every third of it).
CAMPAIGN_EXPIRES = 60

#: How long a candidate that keeps campaigning waits, by default, before it
#: queues again when a campaign failed (no server answered, the connection
#: dropped while it waited), in seconds.
RETRY_CAMPAIGN = 1.0

HandleT = TypeVar("HandleT", bound=LockState)
ClientT = TypeVar("ClientT")


def election_key_for(name: str) -> str:
    """The key of the election C{name}; ValueError if it cannot be one (whitespace, too long)."""
    if not isinstance(name, str) or not name:
        raise ValueError("an election's name is a non-empty str")
    key = election_key(name)
    check_key(key)
    return key


class Leader(NamedTuple):
    """
    An election's leader: C{peer} its address (as L{Holder}'s), C{value}
    the value it campaigned with (bytes, or None), C{token} its grant's
    fencing token.
    """

    peer: str
    value: Optional[bytes]
    token: Optional[int]

    def as_dict(self) -> dict[str, Any]:
        """The leader as JSON can carry it (the value as text, bytes that are not UTF-8 as C{\\xNN})."""
        value = None if self.value is None else self.value.decode("utf-8", "backslashreplace")
        return {"leader": self.peer, "token": self.token, "value": value}


def leader_of(holders: Iterable[Holder]) -> Optional[Leader]:
    """The leader among a key's holders (the first: a campaign is exclusive), or None."""
    for holder in holders:
        return Leader(holder.peer, holder.value, holder.token)
    return None


def holders_marking(connection: Any, key: str, mark: Callable[[list[Holder]], None]) -> Request:
    """
    A client's request operation (for C{connection.start}, as
    L{jesync.client.watch.subscribe} is) that asks C{connection}'s session
    for C{key}'s holders and calls C{mark(holders)} as the answer is
    handled, before its result goes on: in the connection's reader, where
    the events written before the answer have all been handed to the
    connection's watches and none written after it yet.  An observation
    marks there how many events its watch had been given: those the answer
    already counts.
    """

    def operation(on_result: Callable[[Any], None], on_error: Callable[[Exception], None]) -> None:
        def answered(holders: list[Holder]) -> None:
            mark(holders)
            on_result(holders)

        connection.session.holders(key, answered, on_error)

    return operation


class LeaderTracker:
    """
    Who leads, from a C{holders} answer and the watch's events after it:
    the consistent start.  L{start} takes the answer, and how many of the
    events to come are from before it (C{skip}); L{told} each event, and
    says whether the leader changed.  An event before L{start} is from
    before the answer too: it changes nothing.

    The leader is the first holder in grant order, as L{leader_of} says of
    a C{holders} answer: the tracker keeps the holders (a campaign holds
    alone, but the key may be held shared by hand), so a grant while one
    leads is not a new leader, and the leader's release makes the next
    holder, if any, the leader.
    """

    def __init__(self) -> None:
        self.started = False
        self._holders: list[Leader] = []
        self._skip = 0

    @property
    def leader(self) -> Optional[Leader]:
        return self._holders[0] if self._holders else None

    def start(self, holders: Iterable[Holder], skip: int = 0) -> Optional[Leader]:
        """The leader in C{holders}; the next C{skip} events told are from before them (and ignored)."""
        self._holders = [Leader(holder.peer, holder.value, holder.token) for holder in holders]
        self.started = True
        self._skip = skip
        return self.leader

    def told(self, event: WatchEvent) -> bool:
        """Apply C{event}; whether the leader changed (then see L{leader})."""
        if not self.started:
            return False
        if self._skip:
            self._skip -= 1
            return False
        if event.kind not in HOLDER_EVENTS or event.holder is None:
            return False
        leader = self.leader
        if event.kind == GRANTED:
            self._holders.append(Leader(event.holder, event.value, event.token))
        else:
            gone = (event.token, event.holder)
            self._holders = [holder for holder in self._holders if (holder.token, holder.peer) != gone]
        return self.leader is not leader


class Leadership(Generic[HandleT]):
    """
    What a campaign won: the leadership of an election, held through one
    lock handle (C{lock}: the client's own, renewing itself).  C{token} is
    its fencing token, C{value} what it campaigned with.  It is C{held}
    until L{resign} (then C{released}) or until it is lost (then C{lost},
    with C{lost_reason}, a L{LockLost}): its connection dropped, its renewal
    was refused or went unanswered, its failsafe ran out.  C{add_lost_callback}
    is told, as a lock handle's is.  L{resign} returns what the client's
    C{release} does: a bool, an awaitable of one, a Deferred of one.  A
    context manager (C{with}, C{async with}): leaving resigns, and raises
    L{LockLost} if the leadership was lost meanwhile.
    """

    def __init__(self, name: str, lock: HandleT) -> None:
        #: the election's name
        self.name = name
        #: the lock handle that holds it
        self.lock = lock
        # Told when the application resigns (a Candidacy stops then).
        self._on_resign: list[Callable[[], object]] = []

    def __repr__(self) -> str:
        state = "held" if self.held else "released" if self.released else "lost"
        return f"<Leadership {self.name!r} token={self.token} {state}>"

    @property
    def token(self) -> Optional[int]:
        return self.lock.token

    @property
    def value(self) -> Optional[bytes]:
        return self.lock.value

    @property
    def held(self) -> bool:
        return self.lock.held

    @property
    def released(self) -> bool:
        return self.lock.released

    @property
    def lost(self) -> bool:
        return self.lock.lost

    @property
    def lost_reason(self) -> Optional[LockLost]:
        return self.lock.lost_reason

    def add_lost_callback(self, callback: LostCallback) -> None:
        """Call C{callback(LockLost)} when the leadership is lost (at once if it is); never after L{resign}."""
        self.lock.add_lost_callback(callback)

    def resign(self) -> Any:
        """Give the leadership up: the next candidate, in arrival order, leads at once."""
        released = self.lock.release()  # type: ignore[attr-defined]
        self._told_resigned()
        return released

    def __enter__(self) -> Leadership[HandleT]:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.lock.__exit__(*exc_info)  # type: ignore[attr-defined]
        finally:
            self._told_resigned()

    def _told_resigned(self) -> None:
        for told in self._on_resign:
            told()

    async def __aenter__(self) -> Leadership[HandleT]:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self.lock.__aexit__(*exc_info)  # type: ignore[attr-defined]
        finally:
            self._told_resigned()


class ElectionOver(Generic[ClientT]):
    """
    What the three elections share: the election C{name} (its key, checked
    at once) over a C{client}, and the lock a campaign takes (what the
    client's C{lock} returns: a lock, an awaitable of one, a Deferred of
    one).  Each subclass brings C{campaign}, C{leader} and C{observe} in
    its client's style.
    """

    def __init__(self, client: ClientT, name: str) -> None:
        self.key = election_key_for(name)
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def _campaign_lock(self, value: bytes | str | None, expires: Optional[float], wait: Optional[float]) -> Any:
        """Lock the election's key as a campaign does: waiting, renewing itself, with the candidate's value."""
        return self.client.lock(  # type: ignore[attr-defined]
            self.key, wait=wait, expires=expires, auto_renew=True, value=value
        )


class Election(ElectionOver["Client"]):
    """
    An election over a blocking L{jesync.client.Client}: L{campaign},
    L{leader}, L{observe} (see the module's docstring for the rules).
    """

    def campaign(
        self, value: bytes | str | None, expires: Optional[float] = CAMPAIGN_EXPIRES, wait: Optional[float] = None
    ) -> Leadership[Lock]:
        """
        Wait (in arrival order; at most C{wait} seconds, None: for ever) to
        lead, with C{value} (at most 4096 bytes; what L{leader} and
        observers see: say this candidate's address); the L{Leadership},
        renewing itself every third of C{expires} (the failsafe: None or 0,
        never).  Raise L{jesync.client.LockTimeout} if the wait runs out,
        L{jesync.client.KeyBusy} if this client already campaigns in it, as
        C{lock()} raises.
        """
        return Leadership(self.name, self._campaign_lock(value, expires, wait))

    def leader(self) -> Optional[Leader]:
        """The leader now, or None."""
        return leader_of(self.client.holders(self.key))

    def keep_campaigning(
        self,
        value: bytes | str | None,
        on_elected: Callable[[Leadership[Lock]], object],
        on_lost: Optional[Callable[[LockLost], object]] = None,
        expires: Optional[float] = CAMPAIGN_EXPIRES,
        retry: float = RETRY_CAMPAIGN,
    ) -> BlockingCandidacy:
        """
        Campaign with C{value} in a background thread, and again after every
        lost leadership (on the client's next connection: after a reconnect
        or a failover), until stopped: a L{BlockingCandidacy} (the rules:
        L{Candidacy}).  C{on_elected(leadership)} is called each time it
        leads, C{on_lost(LockLost)} each time that leadership is lost,
        before it queues again.
        """
        return BlockingCandidacy(self, value, on_elected, on_lost, expires, retry).start()

    def observe(self, max_events: int = MAX_EVENTS) -> Observation:
        """
        The leader, then each change of it: an iterator of L{Leader} (None:
        no leader), until closed; a context manager that closes it.  Bound
        to its connection as a watch is (ConnectionLost after the changes
        read before it).
        """
        watch = self.client.watch(self.key, max_events=max_events)
        before: list[int] = []
        try:
            connection = self.client._connection_for(self.key)
            # Nothing has been read from the watch yet: what it queued is what it was given.
            holders = connection.call(holders_marking(connection, self.key, lambda _: before.append(watch._queued())))
            return Observation(watch, holders, before[0])
        except BaseException:
            watch.close()
            raise


class Changes:
    """
    What both observations share: the leader at the start, then what the
    watch's events change (L{LeaderTracker}), for their C{get}.
    """

    def __init__(self, holders: list[Holder], before: int) -> None:
        self._tracker = LeaderTracker()
        self._start: Optional[tuple[bool, Optional[Leader]]] = (True, self._tracker.start(holders, before))

    def _first(self) -> Optional[tuple[bool, Optional[Leader]]]:
        """The start, the first time: C{get}'s answer without reading the watch."""
        start, self._start = self._start, None
        return start

    def _read(self, event: Optional[WatchEvent]) -> Optional[tuple[bool, Optional[Leader]]]:
        """
        C{get}'s answer for what the watch gave (None: nothing in time, or
        closed), or None if it changed nothing: read on.
        """
        if event is None:
            return False, None
        if self._tracker.told(event):
            return True, self._tracker.leader
        return None


class Observation(Changes):
    """What L{Election.observe} returns: an iterator of the leader's changes (L{Leader} or None)."""

    def __init__(self, watch: Watch, holders: list[Holder], before: int) -> None:
        super().__init__(holders, before)
        self._watch = watch

    def get(self, timeout: Optional[float] = None) -> tuple[bool, Optional[Leader]]:
        """
        The next change, waiting at most C{timeout} seconds for each event
        (None: for ever; an event that changes nothing, such as a second
        holder's grant, is read and the wait starts again): C{(True,
        leader)}, or C{(False, None)} if none came in time or the
        observation is closed.  Raises as a watch's C{get} does.
        """
        answer = self._first()
        while answer is None:
            answer = self._read(self._watch.get(timeout))
        return answer

    def __iter__(self) -> Observation:
        return self

    def __next__(self) -> Optional[Leader]:
        changed, leader = self.get()
        if not changed:
            raise StopIteration
        return leader

    def close(self) -> None:
        """Stop observing (never raises)."""
        self._watch.close()

    def __enter__(self) -> Observation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncElection(ElectionOver["AsyncClient"]):
    """An election over an L{jesync.client.AsyncClient}: L{Election}'s operations, awaited."""

    async def campaign(
        self, value: bytes | str | None, expires: Optional[float] = CAMPAIGN_EXPIRES, wait: Optional[float] = None
    ) -> Leadership[AsyncLock]:
        """As L{Election.campaign}: C{leadership = await election.campaign(value)}."""
        return Leadership(self.name, await self._campaign_lock(value, expires, wait))

    async def leader(self) -> Optional[Leader]:
        """The leader now, or None."""
        return leader_of(await self.client.holders(self.key))

    def keep_campaigning(
        self,
        value: bytes | str | None,
        on_elected: Callable[[Leadership[AsyncLock]], object],
        on_lost: Optional[Callable[[LockLost], object]] = None,
        expires: Optional[float] = CAMPAIGN_EXPIRES,
        retry: float = RETRY_CAMPAIGN,
    ) -> AsyncCandidacy:
        """
        As L{Election.keep_campaigning}, in a task of the running loop (call
        it from a coroutine): an L{AsyncCandidacy}; C{await candidacy.stop()}.
        """
        return AsyncCandidacy(self, value, on_elected, on_lost, expires, retry).start()

    async def observe(self, max_events: int = MAX_EVENTS) -> AsyncObservation:
        """As L{Election.observe}: an async iterator of L{Leader} (None: no leader); C{await} its C{close()}."""
        watch = await self.client.watch(self.key, max_events=max_events)
        before: list[int] = []
        try:
            connection = await self.client._connection(self.client._fleet.index_for(self.key))
            marking = holders_marking(connection, self.key, lambda _: before.append(watch._queued()))
            holders = await connection.call(marking)
            return AsyncObservation(watch, holders, before[0])
        except BaseException:
            await watch.close()
            raise


class AsyncObservation(Changes):
    """What L{AsyncElection.observe} returns: an async iterator of the leader's changes."""

    def __init__(self, watch: AsyncWatch, holders: list[Holder], before: int) -> None:
        super().__init__(holders, before)
        self._watch = watch

    async def get(self, timeout: Optional[float] = None) -> tuple[bool, Optional[Leader]]:
        """As L{Observation.get}."""
        answer = self._first()
        while answer is None:
            answer = self._read(await self._watch.get(timeout))
        return answer

    def __aiter__(self) -> AsyncObservation:
        return self

    async def __anext__(self) -> Optional[Leader]:
        changed, leader = await self.get()
        if not changed:
            raise StopAsyncIteration
        return leader

    async def close(self) -> None:
        """Stop observing (never raises)."""
        await self._watch.close()

    async def __aenter__(self) -> AsyncObservation:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Candidacy(Kept, Generic[HandleT]):
    """
    What L{Election.keep_campaigning} (and its asyncio and Twisted
    counterparts) return: a candidate that campaigns, leads, and when its
    leadership is lost (its connection dropped, the server failed over or
    restarted, its failsafe ran out) is told so and queues again, on a new
    connection, for as long as it is not L{stop}ped.

    The application hears of each turn through two callbacks, in order and
    one at a time: C{on_elected(leadership)} when it leads (a L{Leadership},
    a fresh one each time, with its own fencing token), then
    C{on_lost(LockLost)} when that leadership is lost; only then does it
    campaign again, so the loss is always told before the next leadership,
    never silence (without C{on_lost}, the loss is logged as a warning).
    A resignation (L{Leadership.resign}) by the application is not a loss:
    it stops the candidacy as L{stop} does.  A campaign that fails (no
    server answers) is retried every C{retry} seconds, logged.  An
    exception a callback raises is logged.  C{leadership} is the current
    L{Leadership}, or None while it campaigns.
    """

    def __init__(
        self,
        election: Any,
        value: bytes | str | None,
        on_elected: Callable[[Leadership[HandleT]], object],
        on_lost: Optional[Callable[[LockLost], object]],
        expires: Optional[float],
        retry: float,
    ) -> None:
        check_value(value)  # (a value that cannot be sent is refused at once, not retried)
        self.election = election
        self.value = value
        self.expires = expires
        self.retry = retry
        self._on_elected = on_elected
        self._on_lost = on_lost
        #: the leadership now held, or None
        self.leadership: Optional[Leadership[HandleT]] = None
        #: whether L{stop} was called (or the application resigned)
        self.stopped = False
        #: how many times it was elected
        self.elections = 0

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "leading" if self.leadership is not None else "campaigning"
        return f"<{type(self).__name__} {self.election.name!r} {state}>"

    def _elected(self, leadership: Leadership[HandleT]) -> None:
        self.leadership = leadership
        self.elections += 1
        self._tell(self._on_elected, leadership)

    def _ended(self, leadership: Leadership[HandleT]) -> bool:
        """
        The held C{leadership} ended: tell its loss (True: campaign again),
        or, resigned by the application, stop (False).
        """
        self.leadership = None
        reason = leadership.lost_reason
        if reason is None:  # resigned by the application
            self.stopped = True
            return False
        if self._on_lost is None:
            log.warning("the leadership of the election %r was lost: %s; campaigning again",
                        self.election.name, describe(reason))
        else:
            self._tell(self._on_lost, reason)
        return not self.stopped

    def _failed(self, error: Exception) -> None:
        log.warning("campaigning in the election %r: %s; again in %ss", self.election.name, describe(error), self.retry)

    @property
    def client(self) -> Any:
        return self.election.client

    def _halt(self) -> None:
        """As L{Kept._halt}: the server ends the leadership, and withdraws the campaign, with the connection."""
        super()._halt()
        self.leadership = None


class BlockingCandidacy(KeptInThread, Candidacy["Lock"]):
    """
    L{Candidacy} over a blocking client: it campaigns in a background thread
    of its own, where its callbacks are called.  L{stop} resigns at once
    (no callback is called after it returns, unless it is called from one);
    a campaign still queued when it stops cannot be withdrawn from the
    server (the blocking client cannot cancel a waiting C{lock}): if it is
    granted later, it is resigned at once, without a callback.
    """

    def start(self) -> BlockingCandidacy:
        # (woken by the leadership's loss or resignation, by stop(), or by the retry pause running out)
        self._start_thread(f"jesync campaign {self.election.name}")
        return self

    def _run(self) -> None:
        while not self.stopped:
            leadership = self._attempt(lambda: self.election.campaign(self.value, self.expires))
            if leadership is None:
                continue  # (failed, and retried after a pause; or stopped)
            with self._turn:
                if self.stopped:
                    _resign_quietly(leadership)
                    return
                leadership.add_lost_callback(lambda _: self._wake.set())
                leadership._on_resign.append(self._wake.set)
                self._elected(leadership)
            while leadership.held and not self.stopped:
                self._wake.wait()
                self._wake.clear()
            with self._turn:
                if self.stopped or not self._ended(leadership):
                    return

    def stop(self) -> bool:
        """Stop campaigning and resign if leading (the next candidate leads at once); whether it resigned one."""
        with self._turn:
            self.stopped = True
            self._wake.set()
            leadership, self.leadership = self.leadership, None
        return leadership is not None and _resign_quietly(leadership)


def _resign_quietly(leadership: Leadership[Any]) -> bool:
    """Resign C{leadership}; whether it was held (a dropped connection is no error here: it is not held then)."""
    try:
        return bool(leadership.resign())
    except ClientError:
        return False


class AsyncCandidacy(Candidacy["AsyncLock"]):
    """L{Candidacy} over an asyncio client: a task of its own, in the client's loop; C{await stop()}."""

    def start(self) -> AsyncCandidacy:
        self._task = asyncio.ensure_future(self._run())
        self._kept()
        return self

    def _halt(self) -> None:
        super()._halt()
        self._task.cancel()

    async def _run(self) -> None:
        while not self.stopped:
            try:
                leadership = await self.election.campaign(self.value, self.expires)
            except ClientError as error:
                if self.stopped:
                    return
                self._failed(error)
                await asyncio.sleep(self.retry)
                continue
            ended = asyncio.Event()
            leadership.add_lost_callback(lambda _: ended.set())
            leadership._on_resign.append(ended.set)
            self._elected(leadership)
            while leadership.held and not self.stopped:
                await ended.wait()
                ended.clear()
            if self.stopped or not self._ended(leadership):
                return

    async def stop(self) -> bool:
        """
        Stop campaigning (a queued campaign is withdrawn as a cancelled
        C{lock} is: released at once if granted later) and resign if
        leading; whether a leadership was resigned.
        """
        self.stopped = True
        leadership = self.leadership
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        if leadership is None or not leadership.held:
            return False
        try:
            return bool(await leadership.resign())
        except ClientError:
            return False
