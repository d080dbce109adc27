"""Engine backends: a local vLLM process, a Docker container, or a server already running.

Each backend is a context manager yielding a :class:`RunningEngine` (base URL, log
access, liveness). Backends are the only modules that start or stop engines.
"""
