"""The route guard vLLM runs in front of every route of the server (vllm_route_guard.py, docs/security.md).

vllm_route_guard.py imports only the standard library and what vLLM's server already has: the launcher puts this
folder on the server's PYTHONPATH (the server's interpreter need not have winnow-rl installed).
"""
