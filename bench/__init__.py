"""Benchmarks; run each as ``python -m bench.<name>`` or ``python bench/<name>.py`` (see ``docs/benchmarks.md``)."""
