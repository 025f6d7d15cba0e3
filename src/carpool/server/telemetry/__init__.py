"""What the server tells of itself: metrics, statistics, logs."""
