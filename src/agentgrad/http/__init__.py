"""HTTP plumbing shared by every service and client of the package.

One home for what the store service, the capture proxy, the model server and their clients
all need: the lean synchronous transport (``transport``), the asyncio upstream client the proxy
forwards through (``upstream``), listening sockets and serving helpers (``serve``) and the
OpenAI-style error body (``openai_errors``). Nothing here knows about rollouts or spans.
"""
