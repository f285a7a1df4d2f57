"""The read-only audit side: the chunk store reader, validate, resolve, check-citations."""
