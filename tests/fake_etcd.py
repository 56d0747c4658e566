"""
A fake etcd for the journal's unit tests: a key-value store with
revisions, as the journal's client (C{txn} only), whose transactions are
applied and answered when the test says (L{Request}).  What etcd does with
a transaction is evaluated as etcd would: every compare (C{VALUE},
C{CREATE}, C{MOD}) holding, the success branch, else the failure branch;
one revision for all the writes of one transaction.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from twisted.internet.defer import Deferred

from jesync.cluster.etcd import Compare, Delete, Get, KeyValue, Operation, Put, TxnResult


class Request:
    """One transaction as the journal sent it, awaiting the test."""

    def __init__(
        self, etcd: FakeEtcd, compare: Sequence[Compare], success: Sequence[Operation], failure: Sequence[Operation]
    ) -> None:
        self.etcd = etcd
        self.compare = list(compare)
        self.success = list(success)
        self.failure = list(failure)
        self.answer: Deferred[TxnResult] = Deferred()
        self.result: Optional[TxnResult] = None

    @property
    def tag(self) -> bytes:
        """The tag it writes to the commit key (its last operation)."""
        last = self.success[-1]
        assert isinstance(last, Put)
        return last.value

    def apply(self) -> TxnResult:
        """etcd evaluates (a copy of) it now; the result is kept for L{reply}."""
        self.result = self.etcd.evaluate(self.compare, self.success, self.failure)
        return self.result

    def reply(self) -> None:
        assert self.result is not None
        self.answer.callback(self.result)

    def commit(self) -> None:
        """etcd applies it and answers."""
        self.apply()
        self.reply()


class FakeEtcd:
    """A key-value store with revisions, evaluating transactions when told to."""

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: Dict[bytes, KeyValue] = {}
        self.sent: List[Request] = []

    def put(self, key: bytes, value: bytes) -> int:
        self.revision += 1
        old = self.kvs.get(key)
        created = old.create_revision if old else self.revision
        self.kvs[key] = KeyValue(key, value, created, self.revision, 0)
        return self.revision

    def txn(
        self, compare: Sequence[Compare], success: Sequence[Operation], failure: Sequence[Operation] = ()
    ) -> Deferred[TxnResult]:
        request = Request(self, compare, success, failure)
        self.sent.append(request)
        return request.answer

    def holds(self, condition: Compare) -> bool:
        kv = self.kvs.get(condition.key)
        if condition.target == "VALUE":
            return kv is not None and kv.value == condition.value
        field = {"CREATE": "create_revision", "MOD": "mod_revision"}[condition.target]
        return (getattr(kv, field) if kv else 0) == condition.value

    def evaluate(
        self, compare: Sequence[Compare], success: Sequence[Operation], failure: Sequence[Operation]
    ) -> TxnResult:
        succeeded = all(self.holds(condition) for condition in compare)
        responses: List[Optional[List[KeyValue]]] = []
        written = False
        for operation in success if succeeded else failure:
            if isinstance(operation, Get):
                kv = self.kvs.get(operation.key)
                responses.append([kv] if kv else [])
                continue
            if not written:
                self.revision += 1
                written = True
            if isinstance(operation, Put):
                old = self.kvs.get(operation.key)
                created = old.create_revision if old else self.revision
                self.kvs[operation.key] = KeyValue(operation.key, operation.value, created, self.revision, 0)
            elif isinstance(operation, Delete):
                gone = [key for key in self.kvs if key == operation.key or (operation.prefix and key.startswith(operation.key))]
                for key in gone:
                    del self.kvs[key]
            responses.append(None)
        return TxnResult(succeeded, self.revision, responses)
