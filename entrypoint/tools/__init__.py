"""The tools around a run: the selftest, the benchmark, images (spython), what the host has (hostcheck), data."""
