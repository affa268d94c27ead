"""Benchmarks and the fake upstream they (and the tests) run against."""
