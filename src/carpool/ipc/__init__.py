"""Plumbing between processes: tensors in shared memory, a child's watch of its parent."""
