"""The mesh's PKI: the CA's rules, certificates, callers, SPIFFE identities."""
