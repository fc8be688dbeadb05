"""Benchmarks behind `make bench`: each `bench_<name>.py` is one section of BENCHMARKS.md."""
