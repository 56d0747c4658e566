"""
The HTTP/JSON API (C{--http-port}) and the status page, served by
C{twisted.web} over the same lock table as every other listener.

 - L{jesync.http.api}: the resource every request goes to: the route
   table, JSON in and out, errors as C{{"code", "message"}}, bearer-token
   auth, and replies held until durable in cluster mode.
 - L{jesync.http.state}: what a server's API keeps between requests (its
   listing snapshots, its top, its observers, its last status document),
   held by its context, never at module level.
 - L{jesync.http.locks}: sessions (elock's, shared id space), locks,
   holders and listings.
 - L{jesync.http.coordination}: elections and groups.
 - L{jesync.http.streams}: Server-Sent Events: watches and the status stream.
 - L{jesync.http.status}: the status summary, the status page and the
   OpenAPI document.
 - L{jesync.http.listener}: the connections (counted, protected mode, auth
   deadline) and the site.
"""
