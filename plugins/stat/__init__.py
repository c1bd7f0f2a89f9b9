"""``meshctl stat`` and ``meshctl top``: traffic figures from the proxies' own metrics."""
