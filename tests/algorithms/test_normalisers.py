"""The normaliser table (trainer/algorithms/normalisers.py): one entry per TRL 1.16 loss type, each aggregation
checked by hand, and no other module spelling a set of loss types of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from trainer.algorithms import normalisers
from trainer.algorithms.normalisers import BATCH_TOKEN_NORMALISED, NORMALISERS, ROW_NORMALISED, aggregate, describe

ROOT = Path(__file__).resolve().parents[2]
# rows of 2 and 3 loss tokens (the third token of row 0 is padding and must not count)
PER_TOKEN = torch.tensor([[1.0, 2.0, 30.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
MAX_LEN = 4
BY_HAND = {
    "grpo": ((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2,  # mean over rows of each row's token mean
    "sapo": ((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2,
    "luspo": ((1 + 2) + (4 + 5 + 6)) / 2,  # mean over rows of each row's token sum
    "dr_grpo": 18 / (2 * MAX_LEN),  # all tokens' sum / (rows x max_completion_length)
    "bnpo": 18 / 5,  # the micro-batch's token mean
    "dapo": 18 / 10, "cispo": 18 / 10, "vespo": 18 / 10,  # the generation batch's 10 tokens
}


def trl_loss_types() -> set[str]:
    """The values GRPOConfig's own documentation of ``loss_type`` lists (TRL 1.16)."""
    from trl import GRPOConfig

    doc = GRPOConfig.__doc__.split("loss_type (", 1)[1].split("\n        mask_truncated_completions", 1)[0]
    return set(re.findall(r'^\s+- `"(\w+)"`', doc, flags=re.MULTILINE))


def test_the_table_has_exactly_trls_loss_types():
    assert set(NORMALISERS) == trl_loss_types() == set(BY_HAND)


@pytest.mark.parametrize("loss_type", sorted(BY_HAND))
def test_each_aggregation_by_hand(loss_type):
    got = aggregate(PER_TOKEN, MASK, loss_type, max_completion_length=MAX_LEN, batch_tokens=10.0)
    assert got.item() == pytest.approx(BY_HAND[loss_type], rel=1e-6)


def test_the_derived_sets_and_the_preflight_words():
    assert ROW_NORMALISED == {"grpo", "sapo", "luspo", "dr_grpo"}
    assert BATCH_TOKEN_NORMALISED == {"dapo", "cispo", "vespo"}
    assert describe("dr_grpo", dr_grpo_token_sum=True) == describe("luspo")
    with pytest.raises(ValueError, match="batch_tokens"):
        aggregate(PER_TOKEN, MASK, "dapo", max_completion_length=MAX_LEN)
    with pytest.raises(KeyError, match="known"):
        normalisers.normaliser("ppo")


# Literal collections of loss types that are not a normaliser, each with its reason.
ALLOWED = {
    "trainer/methods/surrogate.py": "SUPPORTED_LOSS_TYPES: the loss types whose policy term is the clipped surrogate",
    "trainer/loss/trl_loss.py": "PPO_CLIPPED: TRL's loss types with PPO's clipped surrogate (a surrogate, not a "
                                "normaliser)",
}


def test_no_other_module_spells_a_set_of_loss_types():
    """A tuple, list or set literal of two or more loss-type names outside the table is a normaliser stated twice."""
    names = set(NORMALISERS)
    found = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "trainer/algorithms/normalisers.py" or rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(values) >= 2 and len(values) == len(node.elts) and set(values) <= names:
                    found.append(f"{rel}:{node.lineno} {values}")
    assert not found, found
