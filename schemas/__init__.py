"""Wire shapes of the HTTP API: pydantic models only, one module per route family."""
