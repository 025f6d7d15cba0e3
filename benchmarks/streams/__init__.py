"""Step-wise models streamed: iteration-level batching against static batching and peers."""
