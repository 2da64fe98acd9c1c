"""SGLang as the tests and benchmarks start it: server.py, its environment (requirements.txt, shims.py)."""
