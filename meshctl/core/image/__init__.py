"""Container images as values: the OCI layout's documents, image references, and the
distribution API's pure parts (auth challenges, error bodies, credentials). No I/O here."""
