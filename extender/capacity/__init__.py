"""Pool capacity: targets, totals and gaps, the instance catalog and the cheapest way to close a gap."""
