"""The batcher: queue, scheduler, requests, executor, batches in flight, options, stats."""
