"""The round engine: the round as named steps over a declared Transport (no transport,
service or client code here)."""
