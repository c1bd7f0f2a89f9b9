"""The mesh model: records, the store, the local config, L4 authorization."""
