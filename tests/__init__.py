"""
jesync's test suite, in four tiers (docs/development.md, "Test tiers"):
C{unit} (no sockets, processes or threads), C{tcp} (real TCP to a server in
this process), C{process} (twistd, the command line, examples, tools) and
C{etcd} (real etcd).  A test module imports no other test module: what
several share is one of the modules beside this one.

Servers and clients:
 - C{support}: a factory's protocol over a StringTransport on a Clock
   (C{UnitServer}, C{connect_unit}), line clients of a real listener, and
   the small constants and helpers many tests use;
 - C{servers}: the real server in a thread (C{serve_in_thread}), C{twistd
   jesync} as a process (C{start_server}), a misbehaving server;
 - C{server_case}: twistd's service started in the test's reactor, and the
   base of the TCP tests that use it;
 - C{twistd_process}: C{twistd jesync} run and watched as a subprocess;
 - C{etcd_server}, C{cluster}, C{cluster_members}: real etcd processes,
   and cluster members on them (as processes, or in the test's process);
   C{fake_etcd}: a store answering the journal's transactions when a unit
   test says;
 - C{client_case}, C{fake_session}, C{failover}, C{client_pki}: what the
   client tests share (a base, the sans-I/O core on a fake clock, standbys,
   certificates and a secured server);
 - C{fresh_python}: what a statement loads in a fresh interpreter.
Protocols and the rest:
 - C{model}: the base of the model-based tests;
 - C{dlock_messages}, C{memcache_messages}, C{fuzz_streams},
   C{auth_listeners}: requests and replies as the tests build and read them;
 - C{openapi_check}: every HTTP reply checked against the API's OpenAPI
   document (C{check_response}).
 - C{http_client}: the HTTP API called over real HTTP with treq, every
   reply checked by C{openapi_check}, and the real server with
   C{--http-port} (C{start_http}); C{http_events}: its event streams read
   as they arrive; C{http_unit}: the HTTP API on a Clock, through
   twisted.web's channel over a StringTransport.
 - C{status_browser}: headless chromium under chromedriver (selenium), for
   the status page's tests.
 - C{tls_certificates}, C{tls_server}, C{metrics_server}, C{tooz_case},
   C{doc_pages}: TLS, metrics, tooz and the docs' pages, for their tests.
"""
