"""HTTP plumbing shared by every service and client of the package.

One home for what the store service, the capture proxy, the model server and their clients
all need: the synchronous transport every blocking client sends through, with its one
stale-connection retry rule (``transport``: a lean HTTP/1.1 pool, httpx for TLS and proxies),
its asyncio twin the proxy forwards through (``upstream``), listening sockets and uvicorn run
in a thread or until SIGTERM (``serve``), the gate every server puts in front of its routes —
allowed hosts, bearer token, body limit, JSON-only bodies (``guard``) — the request-body parser
that refuses what would break later code (``jsonbody``), and the OpenAI-style error body
(``openai_errors``).
Nothing here knows about rollouts or spans.
"""
