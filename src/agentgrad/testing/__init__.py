"""Stand-ins for tests and benchmarks, shipped so that users' own tests can use them too.

``stub`` is a scripted OpenAI-compatible upstream: a named fake for a hosted LLM API that
cannot exist on a machine without network.
"""
