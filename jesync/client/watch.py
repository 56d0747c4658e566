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
iterator, an async iterator, a callback).
"""

from __future__ import annotations

from typing import Any, Callable

from jesync.client.wire import KEY_EVENTS, WatchEvent

OnEvent = Callable[[WatchEvent], None]
OnEnd = Callable[[Exception], None]


def subscribe(
    session_watch: Callable[..., Subscription],
    key: str,
    prefix: bool,
    on_event: OnEvent,
    on_end: OnEnd,
    subscriptions: list[Subscription],
) -> Callable[[Callable[[Any], None], Callable[[Exception], None]], None]:
    """
    A client's request operation (for its connection's C{start}) that asks
    C{session_watch} (a L{jesync.client.session.Session.watch}) for a
    subscription and appends it to C{subscriptions} at once, before the
    server answers: a caller who stops waiting (cancelled, interrupted)
    still has it to unwatch.
    """

    def operation(on_result: Callable[[Any], None], on_error: Callable[[Exception], None]) -> None:
        subscriptions.append(session_watch(key, prefix, on_event, on_end, on_result, on_error))

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
