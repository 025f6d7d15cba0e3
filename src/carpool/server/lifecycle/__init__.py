"""Served models: the registry, loads, unloads and repository polls."""
