"""Rows to bytes: every wire encoding of an embedding lives in :mod:`app.wire.encodings`."""
