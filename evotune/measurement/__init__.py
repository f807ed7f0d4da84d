"""Measurement: build, verify and time a point (GPU or CPU), or replay a recorded landscape; the oracle, the
worker processes, the compiled-kernel cache and the built-in workloads with their GPU side."""
