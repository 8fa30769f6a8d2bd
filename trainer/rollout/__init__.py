"""Generation beyond TRL's single turn: the multi-turn environment rollout (``multi_turn``) and the think
prefill of single-turn tasks (``prefill``).
"""
