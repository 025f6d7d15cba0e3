"""Shaping rows into batches: stacking, padding, counting tokens; pure data."""
