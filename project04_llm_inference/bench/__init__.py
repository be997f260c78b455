"""Benchmarks: run(config) -> one JSON record each (kernels, offline throughput, latency, memory, prefix caching)."""
