"""The one inference path every protocol takes: admit, batch, cache, outcome."""
