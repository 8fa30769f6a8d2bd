"""GRPODropout's knobs: a mixin of ``WinnowConfig`` (its fields appear there and in ``--help`` like every other one).

Imports only the pure algorithm's option types, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.algorithms.dropout import DeleteKind, RecenterMode, Selector, SurprisalBasis, ZeroPushGroups


@dataclass
class GRPODropoutFields:
    """GRPODropout (``rollout_dropout: grpodropout``; docs/grpodropout.md)."""

    dropout_selector: Selector = field(
        default="paper",
        metadata={
            "help": "GRPODropout selection rule: 'paper' (greedy max-cardinality solution of eq. 4, then the "
            "restoration of dropout_delete), 'balanced_push' (the released code's main selector, variant `balance`: "
            "keep every positive push, add negative pushes while the kept sum stays > 1e-12, keep at least max(1, "
            "G // 4)) or 'balanced_push_neg' (variant `balance_neg`: balanced_push, then every dropped rollout with a "
            "negative push and a negative advantage comes back)."
        },
    )
    dropout_zero_push_groups: ZeroPushGroups = field(
        default="keep_all",
        metadata={
            "help": "What a balanced selector keeps of a group whose pushes are all zero (equal rewards): 'keep_all' "
            "(the paper's rule, sum h = 0 >= 0) or 'random_min_keep' (the released code: a random max(1, G // 4) "
            "of them, drawn reproducibly from the seed and the group's tokens)."
        },
    )
    dropout_restandardize: bool = field(
        default=False,
        metadata={
            "help": "Recompute the GRPO advantages over each group's kept rollouts before recentering (the released "
            "code's RECOMPUTE_ADV_AFTER_SELECT=True: verl's per-group mean and unbiased std + advantage_eps on the "
            "kept rows; a group with one kept row gets A = R). Only when a rollout was dropped. advantage: grpo only."
        },
    )
    dropout_delete: DeleteKind = field(
        default="positive",
        metadata={
            "help": "Which removed rollouts stay removed (paper's selector): 'positive' (paper, eq. 7: every removed "
            "rollout with A <= 0 is restored), 'negative' (restore A >= 0), 'both' (restore nothing). Table 2 rows. "
            "dropout_selector 'balanced_push' has its own rule and rejects any other value than the default."
        },
    )
    dropout_recenter: RecenterMode = field(
        default="prob_weighted",
        metadata={
            "help": "Recentering of the kept advantages: 'prob_weighted' (paper, eq. 9: subtract the old-policy "
            "probability-weighted mean, a softmax of -surprisal over the kept set), 'mean' (equal weights), 'none'."
        },
    )
    dropout_surprisal_basis: SurprisalBasis = field(
        default="mean",
        metadata={
            "help": "Surprisal of a rollout from old-policy token log-probs: 'mean' (length-normalised, the paper's "
            "practice) or 'sum' (full-sequence surprisal of §3.1)."
        },
    )
