"""
The connection layer every listener runs on: framing (L{framing}), the
connection lifecycle (L{lifecycle}), one connection with its output, waits
and limits (L{connection}), what a wire protocol writes to be served
(L{grammar}), and the policy and registry all connections share
(L{policy}).  A wire protocol (L{jesync.protocols}) is only a grammar.
"""
