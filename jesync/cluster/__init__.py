"""
Cluster mode (C{--etcd}): several jesync processes, one elected leader that
serves, and the state that must outlive a connection kept in etcd.

 - L{jesync.cluster.etcd}: a non-blocking client of etcd's v3 JSON gateway.
 - L{jesync.cluster.journal}: the durable state, written to etcd in group
   commits before the replies that depend on it.
 - L{jesync.cluster.member}: one member's election, leadership terms and
   stepping down.
"""
