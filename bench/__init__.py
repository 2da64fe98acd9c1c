"""Benchmarks and soak tests: scripts, never imported by the app."""
