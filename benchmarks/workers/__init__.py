"""Where replicas live: threads, child processes, Ray actors; their transport, faults, scale-out."""
