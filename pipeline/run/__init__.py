"""A corpus run: discovery, the worker and its executors, atomic emit, state, change feed, redirects, watch.

Start at ``session.py`` (a sync: plan → begin → execute → record → finish); ``model.py``
holds the plain types every other module speaks. This layer calls the runner; the parent
process alone writes the state, the feed and the lock.
"""
