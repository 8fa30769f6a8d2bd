"""The command-line entry points: ``winnow-train`` (trainer/cli/train.py) and ``winnow-eval`` (trainer/cli/eval.py).

Installed as console scripts by pyproject.toml; launch/train.py and launch/eval.py run the same code from a checkout.
"""
