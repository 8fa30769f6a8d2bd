"""vLLM server mode: the hardened client (``client``), TRL's server generation with a weight sync that needs
no NCCL (``generation``) and the sync mechanisms themselves (``weight_sync``).
"""
