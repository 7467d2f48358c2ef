"""Benchmarks: ``make bench`` runs ``python -m tests.bench.bench_review``.

No file here is named ``test_*``, so pytest collects none of them.
"""
