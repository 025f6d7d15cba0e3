"""Embeddings: all-MiniLM-L6-v2 served against its peers, and its int8 engine across CPUs."""
