"""Hashed prompt caching (issue 5): the exact-match response cache and prefix hashes.

``responses.ResponseCache`` is what the pipeline calls; ``key`` says what an entry is keyed on,
``store`` where entries live (memory or Redis, ``store.build_store`` picks), ``flight`` how
identical concurrent requests share one upstream call, ``entry`` what a stored answer is, and
``prefix`` the chained prefix hashes behind provider prompt caching and engine affinity. This
package file imports nothing, so provider adapters can use ``prefix`` (a pure function of the
canonical request) without pulling in the cache itself.
"""
