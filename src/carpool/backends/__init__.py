"""Backends: carpool.Model objects for real model formats."""
