"""The engine benchmarks: what carpool's in-process batcher costs and buys, no server."""
