"""xDS as values: Delta xDS streams and the resources each proxy may see."""
