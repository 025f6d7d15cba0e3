"""carpool bench: load generation, measurement and reports for v2 servers and batchers."""
