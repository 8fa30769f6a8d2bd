"""``old_logps_source: sampler`` needs a generator that returns per-token log-probs. The environment rollout's local
backend (``model.generate``) returns none: that is a ConfigError naming the field, raised before any weights load
(the model path below does not exist, so reaching the load would raise something else)."""

from __future__ import annotations

import pytest
from harness import BASE_ARGS, reward_token_parity
from transformers import AutoTokenizer

from envs.episode import EpisodeSettings
from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.rollout.multi_turn import ChatTokens, MultiTurnRollout, training_chat_template


def test_sampler_logps_with_the_local_env_rollout_fail_before_load(tiny_model, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rollout = MultiTurnRollout(
        "frozenlake", {}, EpisodeSettings(), 16, 0.5, ChatTokens(tok, training_chat_template(tok))
    )
    args = WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, old_logps_source="sampler",
                        rollout_dropout="grpodropout")
    with pytest.raises(ConfigError, match="old_logps_source.*rollout_func.*MultiTurnRollout") as err:
        WinnowGRPOTrainer(model=str(tmp_path / "not-loaded"), reward_funcs=reward_token_parity, args=args,
                          rollout_func=rollout)
    assert "old_logps_source='policy'" in str(err.value)
    assert MultiTurnRollout.returns_logprobs(WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS)) is False
