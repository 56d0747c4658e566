"""
The watches of one connection, shared by the three clients: which of the
client's watches each C{EVENT} line goes to.

The server watches a key (or a prefix) once per connection, however many
times it is asked, and tells the connection of a change once, however many
of its watches match it.  A client may still watch the same key several
times on one connection (two threads, two tasks): each is a
L{Subscription}, and the connection's L{Watches} route every event to each
one that matches, so:

 - The server is asked to C{watch} for each subscription, and to
   C{unwatch} only when the last subscription of a key (or prefix) ends,
   counting those still waiting for their C{WATCHING}: so an C{unwatch}
   never undoes a C{watch} sent before it for another subscription.
 - A subscription gets the events read after its C{WATCHING} reply (from
   then on the server reports every change, in order); C{appeared} and
   C{disappeared} go to prefix subscriptions only (the server sends them
   only for those).
 - When the connection fails, every subscription ends with the
   connection's error (L{jesync.client.errors.ConnectionLost}): a watch is
   bound to its connection, as a lock is, and is never silently dropped.

No I/O here: the clients wrap a subscription in their own watch object (an
iterator, an async iterator, a callback).  The iterators (L{QueuedWatch}:
the blocking client's and the asyncio client's) queue the events they are
told for their reader, at most C{max_events} (L{MAX_EVENTS} unless the
caller says): a reader that falls further behind ends its watch with
L{WatchFellBehind}, after the events queued before, and the watch stops
watching on the server.  So a slow reader (C{jesync watch | slow}) holds
a bounded memory, and the server's C{--max-unsent} stays the bound of
what waits on the server's side.  (The Twisted client's watch calls its
callback as each event is read: it has no queue.)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from jesync.client.errors import ClientError, WatchFellBehind
from jesync.client.wire import KEY_EVENTS, WatchEvent

OnEvent = Callable[[WatchEvent], None]
OnEnd = Callable[[Exception], None]
#: A request for a client connection's C{start}: called with its result and error callbacks.
Request = Callable[[Callable[[Any], None], Callable[[Exception], None]], None]


def subscribe(
    connection: Any,
    key: str,
    prefix: bool,
    on_event: OnEvent,
    on_end: OnEnd,
    subscriptions: list[tuple[Any, Subscription]],
) -> Request:
    """
    A client's request operation (for C{connection.start}) that asks
    C{connection}'s session (L{jesync.client.session.Session.watch}) for a
    subscription and appends it, with C{connection}, to C{subscriptions}
    at once, before the server answers: a caller who stops waiting
    (cancelled, interrupted) still has it to unwatch.
    """

    def operation(on_result: Callable[[Any], None], on_error: Callable[[Exception], None]) -> None:
        subscription = connection.session.watch(key, prefix, on_event, on_end, on_result, on_error)
        subscriptions.append((connection, subscription))

    return operation


class Subscription:
    """
    One watch of a key (or, with C{prefix}, of every key that starts with
    C{key}; C{""}: every key) on one connection.  C{on_event} gets each
    event once it is C{active}; C{on_end} the connection's error if the
    connection fails while it is active.
    """

    def __init__(self, key: str, prefix: bool, on_event: OnEvent, on_end: OnEnd) -> None:
        self.key = key
        self.prefix = prefix
        self.on_event = on_event
        self.on_end = on_end
        #: the server has confirmed it (WATCHING): events go to it
        self.active = False
        #: unwatched, or ended with its connection
        self.ended = False

    def __repr__(self) -> str:
        what = "prefix" if self.prefix else "key"
        state = "ended" if self.ended else "active" if self.active else "pending"
        return f"<Subscription {what} {self.key!r} {state}>"


class Watches:
    """The subscriptions of one connection, by what they watch."""

    def __init__(self) -> None:
        self._by_key: dict[str, list[Subscription]] = {}
        self._by_prefix: dict[str, list[Subscription]] = {}

    def __len__(self) -> int:
        """How many subscriptions (active or waiting for their reply)."""
        return sum(map(len, self._by_key.values())) + sum(map(len, self._by_prefix.values()))

    def _table(self, prefix: bool) -> dict[str, list[Subscription]]:
        return self._by_prefix if prefix else self._by_key

    def add(self, subscription: Subscription) -> None:
        self._table(subscription.prefix).setdefault(subscription.key, []).append(subscription)

    def remove(self, subscription: Subscription) -> bool:
        """
        Forget C{subscription}; whether it was the last of its key (or
        prefix), so that the server may stop watching it.
        """
        table = self._table(subscription.prefix)
        others = table.get(subscription.key, [])
        if subscription in others:
            others.remove(subscription)
        if others:
            return False
        table.pop(subscription.key, None)
        return True

    def dispatch(self, event: WatchEvent) -> None:
        """Give C{event} to every active subscription it matches."""
        matching = [] if event.kind in KEY_EVENTS else list(self._by_key.get(event.key, ()))
        for prefix, subscriptions in list(self._by_prefix.items()):
            if event.key.startswith(prefix):
                matching.extend(subscriptions)
        for subscription in matching:
            if subscription.active and not subscription.ended:
                subscription.on_event(event)

    def end_all(self, error: Exception) -> None:
        """The connection failed: every subscription ends; the active ones are told C{error}."""
        subscriptions = [s for table in (self._by_key, self._by_prefix) for group in table.values() for s in group]
        self._by_key.clear()
        self._by_prefix.clear()
        for subscription in subscriptions:
            was_active = subscription.active and not subscription.ended
            subscription.ended = True
            subscription.active = False
            if was_active:
                subscription.on_end(error)


#: How many events an iterator watch keeps for a reader that falls behind, by
#: default: at a few hundred bytes each, a few MB; many minutes of changes
#: to one key, seconds of a busy prefix.
MAX_EVENTS = 10_000

#: What ends a L{QueuedWatch}'s queue when it is closed.
CLOSED = object()


class QueuedWatch:
    """
    What the blocking L{jesync.client.Watch} and the asyncio
    L{jesync.client.AsyncWatch} share: what they watch, their subscriptions
    (one per connection: a prefix watch watches every server), and what
    goes into their queue: the events while there is room, then the error
    that ended the watch (L{WatchFellBehind}, or the connection's
    L{jesync.client.errors.ConnectionLost}), then L{CLOSED}.  Each
    subclass brings its queue and its waiting: L{_put}, L{_queued},
    L{_stop}; C{get()} and C{close()} are built on L{_open},
    L{_taken} and L{_closing}.
    """

    def __init__(self, key: str, prefix: bool, max_events: int = MAX_EVENTS) -> None:
        if isinstance(max_events, bool) or not isinstance(max_events, int):
            raise TypeError(f"max_events is an int, not {type(max_events).__name__}")
        if max_events < 1:
            raise ValueError("max_events is at least 1")
        #: what it watches: a key, or (with C{prefix}) the start of keys
        self.key = key
        self.prefix = prefix
        #: the most events it keeps for its reader (see L{WatchFellBehind})
        self.max_events = max_events
        self._subscriptions: list[tuple[Any, Subscription]] = []
        #: the error its reader was given (raised again on every later call)
        self._error: Optional[ClientError] = None
        self._fell_behind = False
        self._closed = False

    def __repr__(self) -> str:
        state = " closed" if self._closed else " fell behind" if self._fell_behind else ""
        return f"<{type(self).__name__} {'prefix' if self.prefix else 'key'} {self.key!r}{state}>"

    # -- what a subclass brings ------------------------------------------

    def _put(self, item: object) -> None:
        """Queue C{item} for the reader (waking it)."""
        raise NotImplementedError

    def _queued(self) -> int:
        """How many items wait in the queue."""
        raise NotImplementedError

    def _stop(self, connection: Any, subscription: Subscription) -> None:
        """
        Unwatch C{subscription} without waiting for the answer: called while
        C{connection} hands it an event (in its reader, holding whatever the
        client holds then).
        """
        raise NotImplementedError

    # -- shared ----------------------------------------------------------

    def _subscription_request(self, connection: Any) -> Request:
        """The request (for C{connection.start}) that watches on C{connection} (L{subscribe})."""

        def on_event(event: WatchEvent) -> None:
            self._told(connection, event)

        return subscribe(connection, self.key, self.prefix, on_event, self._put, self._subscriptions)

    def _told(self, connection: Any, event: WatchEvent) -> None:
        """
        An event for the reader: queued if there is room; else the watch
        has fallen behind (queue L{WatchFellBehind} once) and stops
        watching on C{connection} (and on the others, as each next tells it
        of an event; L{close} stops them all).
        """
        if self._closed:
            return
        if not self._fell_behind:
            if self._queued() < self.max_events:
                self._put(event)
                return
            self._fell_behind = True
            self._put(WatchFellBehind(self.key, self.prefix, self.max_events))
        for each, subscription in list(self._subscriptions):
            if each is connection and not subscription.ended:
                self._stop(connection, subscription)

    def _open(self) -> bool:
        """
        Before C{get()} takes from the queue: raise the error that ended the
        watch if the reader was given it; False once it is closed and
        nothing is left to read.
        """
        if self._error is not None:
            raise self._error
        return not (self._closed and self._queued() == 0)

    def _taken(self, item: object) -> Optional[WatchEvent]:
        """
        What C{get()} returns for C{item}, taken from the queue: the event,
        or None once closed; an error is recorded for L{_open} and returned
        as None: then C{get()} closes the watch and raises C{self._error}.
        """
        if item is CLOSED:
            return None
        if isinstance(item, ClientError):
            self._error = item
            return None
        assert isinstance(item, WatchEvent)
        return item

    def _closing(self) -> list[tuple[Any, Subscription]]:
        """
        Mark the watch closed and wake its reader (events told from now on
        are dropped); the subscriptions to unwatch (none if it was already
        closed).
        """
        if self._closed:
            return []
        self._closed = True
        subscriptions, self._subscriptions = self._subscriptions, []
        self._put(CLOSED)
        return subscriptions
