"""The load generator benchmarks: ``carpool bench``'s own ceiling, and the curves it draws."""
