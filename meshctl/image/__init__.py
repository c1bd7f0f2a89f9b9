"""Container images on disk and on registries: the tarball writer and reader, the meshctl image
of this binary, its Debian base layer, and the distribution API client that pushes it."""
