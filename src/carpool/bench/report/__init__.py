"""What a carpool bench run measured: records, tables, plots, server scrapes."""
