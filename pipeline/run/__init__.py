"""A corpus run: discovery, the worker and its executors, atomic emit, state, change feed, redirects, watch.

This layer calls the runner; the parent process alone writes the state, the feed and the lock.
"""
