"""The model card of a winnow run: ``README.md`` in output_dir, written by TRL with every checkpoint (and by
``push_to_hub``) through ``create_model_card``, which ``WinnowGRPOTrainer`` overrides to call :func:`create`.

TRL's card (``_BaseTrainer.create_model_card``, trl/trainer/base_trainer.py) reads the base model from the loaded
config's path and knows no dataset. Around it the winnow card

- names the model the run started from: an ``offline:`` alias built from a published model names that model, any
  other local folder its path (TRL has no name for a local folder: its card read "fine-tuned version of [None]");
- carries the tag ``winnow-rl`` (``WinnowGRPOTrainer._tag_names``, next to TRL's ``trl`` and ``grpo``) and the
  method: each stage that is on, as ``<kind>:<name>`` (``rollout_dropout:grpodropout``, ``loss_variant:kl_cov``);
- names the dataset: a Hub id in the card's ``datasets:`` metadata (TRL links it), and every dataset -- a
  registered winnow task such as ``arithmetic`` or a local file is no Hub dataset -- in one line of the card's text.

What to name comes from the recipe: ``build_trainer`` (trainer/recipe.py) sets ``trainer.card_facts``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from huggingface_hub import ModelCard, ModelCardData

# Each stage kind's value that leaves TRL's GRPO unchanged (WinnowConfig's defaults): not part of the method.
STAGES_OFF = {"rollout_filter": "none", "rollout_dropout": "none", "advantage": "grpo", "loss_variant": "none"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRL_LINE = "It has been trained using [TRL](https://github.com/huggingface/trl)."
_NO_BASE = "[None](https://huggingface.co/None)"
_FILES = (".parquet", ".jsonl", ".json", ".csv", ".arrow")  # a data file's path, not a Hub id


@dataclass
class CardFacts:
    """What the card names that the trainer does not know: the recipe's model and dataset."""

    model_name_or_path: str | None = None  # as the recipe wrote it (an offline: alias, a local folder, a Hub id)
    base_model: str | None = None  # the published model it is (an alias's source), else the same
    dataset_name: str | None = None  # the recipe's dataset_name
    dataset_hub_id: str | None = None  # the Hub dataset it reads, when it reads one


def hub_dataset_id(dataset_name: str, dataset_kwargs: dict | None, registered: bool) -> str | None:
    """The Hub id a recipe's dataset reads, when it is recognisably one: ``dataset_name`` itself, or a registered
    loader's ``path``, shaped ``org/name`` and neither an existing local path nor a data file's name."""
    candidate = str((dataset_kwargs or {}).get("path") or "") if registered else dataset_name
    if candidate and _HUB_ID.match(candidate) and not os.path.exists(candidate) and not candidate.endswith(_FILES):
        return candidate
    return None


def method_tags(args: Any) -> list[str]:
    """``<kind>:<name>`` for each stage of ``args`` that is on (not its :data:`STAGES_OFF` value)."""
    return [f"{kind}:{getattr(args, kind)}" for kind, off in STAGES_OFF.items()
            if getattr(args, kind, off) not in (off, None)]


def method_text(args: Any) -> str:
    """The method in words: TRL's GRPO, with the stages that are on."""
    stages = [f"{kind} `{getattr(args, kind)}`" for kind, off in STAGES_OFF.items()
              if getattr(args, kind, off) not in (off, None)]
    return "GRPO" + (f" with {', '.join(stages)}" if stages else " (every stage off: TRL's GRPO)")


def name_base_model(card_path: Path, base_model: str) -> None:
    """Name ``base_model`` (a published model's id) in a card TRL wrote without one, as TRL names a Hub model: the
    card's ``base_model`` metadata and its "fine-tuned version of" link.

    Why after TRL: TRL's ``create_model_card`` reads the base model only from the loaded config's path, which for an
    ``offline:`` alias is a local folder (TRL then writes ``[None]``); it takes no base-model argument."""
    card = ModelCard.load(card_path)
    data = card.data.to_dict()
    data["base_model"] = base_model
    text = card.text.replace(_NO_BASE, f"[{base_model}](https://huggingface.co/{base_model})")
    ModelCard(f"---\n{ModelCardData(**data).to_yaml()}\n---\n{text}").save(card_path)


def create(trainer: Any, create_trl: Callable[..., None], model_name: str | None = None,
           dataset_name: str | None = None, tags: str | list[str] | None = None) -> None:
    """TRL's ``create_model_card`` (``create_trl``) with winnow's base model, tags and dataset (module doc)."""
    facts = getattr(trainer, "card_facts", None) or CardFacts()
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    tags += [t for t in method_tags(trainer.args) if t not in tags]  # winnow-rl: WinnowGRPOTrainer._tag_names
    dataset_name = dataset_name or facts.dataset_hub_id
    create_trl(model_name=model_name, dataset_name=dataset_name, tags=tags)
    card = Path(trainer.args.output_dir) / "README.md"
    if not trainer.is_world_process_zero() or not card.is_file():
        return
    if _NO_BASE in card.read_text() and _HUB_ID.match(facts.base_model or "") and not os.path.isdir(facts.base_model):
        name_base_model(card, facts.base_model)
    text = card.read_text()
    if _NO_BASE in text and facts.model_name_or_path:
        text = text.replace(_NO_BASE, f"`{facts.model_name_or_path}` (a local model)")
    line = f"It has been trained with winnow-rl: {method_text(trainer.args)}"
    if facts.dataset_name:
        line += f", on the `{facts.dataset_name}` dataset"
    if _TRL_LINE in text and line not in text:
        text = text.replace(_TRL_LINE, f"{_TRL_LINE}\n{line}.", 1)
    card.write_text(text)
