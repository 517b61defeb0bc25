"""Loopback stand-ins started by tests, benchmarks and ``make demo``: nothing here reaches the internet."""
