"""Traffic figures from the proxies' own metrics: parse, difference, attribute (stat, top)."""
