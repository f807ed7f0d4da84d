"""evotune's built-in search spaces. Each module defines ``SPACE``, a SearchSpace."""
