"""The peer LLM servers, each from its own pinned environment with the shims this CPU needs, started on
loopback: vLLM (``vllm/``, .venv-vllm) and SGLang (``sglang/``, .venv-sglang). The benchmarks measure
mmencode against them and the tests use them as oracles; both start them through these modules."""
