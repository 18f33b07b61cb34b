"""The store as an HTTP service: many runners on many machines share one store through it.

``server`` builds and runs the service (``StoreServer``, ``create_app``, ``serve``); ``api`` answers
the store's calls over bare ASGI from the route table in ``routes``; ``wire`` holds the request
and response shapes that server and client share; ``fastpath`` answers store calls straight from
uvicorn's HTTP parser; ``otlp`` ingests OpenTelemetry traces; ``openapi`` documents the routes.
"""
