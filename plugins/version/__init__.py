"""``meshctl version``: what this binary is made of."""
