"""Streams: step-wise models (iteration-level batching) against static batching and their limits."""
