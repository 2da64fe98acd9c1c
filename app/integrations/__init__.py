"""Peers' formats (vLLM, SGLang): adapters at the edge; the scheduler and worker do not know them."""
