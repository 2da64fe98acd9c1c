"""vLLM as the tests and benchmarks start it: server.py (the CPU recipe of docs/vllm.md), its environment
(requirements.txt, shims.py) and the Mooncake consumer's shim."""
