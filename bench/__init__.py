"""Benchmarks, one package per study: ``bench/<study>/`` holds the study's script and the
report it writes, run from the repository root as ``python -m bench.<study>.run``;
``bench.lib`` is what the studies share. No study imports another."""
