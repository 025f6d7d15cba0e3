"""Server benchmarks: what carpool serve's features cost and what it survives."""
