"""GAE, the clipped value loss and explained variance (trainer/algorithms/gae.py) against an independent reference
and hand-worked cases.

The reference does not run verl's masked recursion: per row it removes the unmasked tokens, runs the textbook GAE
recursion (Schulman et al. 2016 eq. 16, finite horizon) over the model tokens alone, scatters the result back (an
unmasked token carries the advantage of the next model token, or 0 after the last), then whitens with numpy's
ddof=1 statistics. Agreement on random inputs with gaps is the claim that the masked recursion skips observation
tokens exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer.algorithms.gae import (
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    last_token_rewards,
    masked_whiten,
)

pytestmark = pytest.mark.unit


def reference_gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float):
    """(whitened advantages, returns) by compressing out the unmasked tokens of each row."""
    rows, tokens = values.shape
    raw = np.zeros((rows, tokens))
    for i in range(rows):
        idx = [t for t in range(tokens) if mask[i, t]]
        adv = {}
        running = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            v_next = values[i, idx[k + 1]] if k + 1 < len(idx) else 0.0
            running = rewards[i, t] + gamma * v_next - values[i, t] + gamma * lam * running
            adv[t] = running
        carried = 0.0  # an unmasked token carries the advantage of the next model token
        for t in reversed(range(tokens)):
            if t in adv:
                carried = adv[t]
            raw[i, t] = carried
    returns = raw + values
    live = raw[mask.astype(bool)]
    whitened = (raw - live.mean()) / math.sqrt(live.var(ddof=1) + 1e-8)
    return whitened, returns


def random_case(seed: int, rows: int = 5, tokens: int = 17):
    g = np.random.default_rng(seed)
    mask = (g.random((rows, tokens)) < 0.7).astype(np.float64)
    mask[:, 0] = 1.0  # every row has a model token
    mask[1, 10:] = 0.0  # a long right padding
    mask[2, 3:8] = 0.0  # an observation span between turns
    rewards = g.normal(size=(rows, tokens)) * (g.random((rows, tokens)) < 0.3)
    values = g.normal(size=(rows, tokens))
    return rewards, values, mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (0.9, 1.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_the_compressed_reference(seed, gamma, lam):
    rewards, values, mask = random_case(seed)
    advantages, returns = gae_advantages(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), gamma, lam)
    ref_adv, ref_ret = reference_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(returns.numpy(), ref_ret, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(advantages.numpy(), ref_adv, rtol=1e-10, atol=1e-10)
    assert np.abs(ref_adv).max() > 0.5  # a non-trivial case


def test_observation_tokens_do_not_change_the_model_tokens():
    """Inserting unmasked columns with arbitrary rewards and values leaves every model token's advantage and
    return as it was."""
    rewards, values, mask = random_case(3, rows=3, tokens=9)
    mask[:] = 1.0
    a, r = gae_advantages(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask), 0.95, 0.9)
    g = np.random.default_rng(9)
    insert = [2, 5, 5, 9]  # positions in the original row, before which a column goes
    wide_r = np.insert(rewards, insert, g.normal(size=(3, 4)), axis=1)  # rewards on observation tokens are ignored
    wide_v = np.insert(values, insert, g.normal(size=(3, 4)), axis=1)
    wide_m = np.insert(mask, insert, 0.0, axis=1)
    wa, wr = gae_advantages(torch.tensor(wide_r), torch.tensor(wide_v), torch.tensor(wide_m), 0.95, 0.9)
    keep = wide_m[0].astype(bool)
    torch.testing.assert_close(wa[:, keep], a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(wr[:, keep], r, rtol=1e-12, atol=1e-12)


def test_gae_hand_worked_undiscounted_with_a_gap():
    """gamma = lam = 1 (RAGEN's PPO): before whitening A_t = (sum of rewards from t) - V_t and every model token's
    return is the episode's reward. Row: model, model, observation, model; reward 1 at the last token."""
    values = torch.tensor([[0.5, 0.2, 9.0, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    advantages, returns = gae_advantages(rewards, values, mask, 1.0, 1.0)
    # raw: t3 = 1 - 0.1 = 0.9; t2 carries 0.9; t1 = 0 + 0.1 - 0.2 + 0.9 = 0.8; t0 = 0 + 0.2 - 0.5 + 0.8 = 0.5
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 9.9, 1.0]], dtype=torch.float64))
    raw = torch.tensor([0.5, 0.8, 0.9, 0.9], dtype=torch.float64)
    mean = (0.5 + 0.8 + 0.9) / 3
    var = ((0.5 - mean) ** 2 + (0.8 - mean) ** 2 + (0.9 - mean) ** 2) / 2  # 0.04333...
    torch.testing.assert_close(advantages[0], (raw - mean) / math.sqrt(var + 1e-8))


def test_gae_hand_worked_discounted():
    """gamma = 0.5, lam = 0.5, two rows of three model tokens (whitening over all six)."""
    values = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 0.0, 4.0], [1.0, 0.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.float64)
    advantages, returns = gae_advantages(rewards, values, mask, 0.5, 0.5)
    # row 0: d2 = 4 - 3 = 1; d1 = 0 + 1.5 - 2 = -0.5; d0 = 0 + 1 - 1 = 0
    #        A2 = 1; A1 = -0.5 + 0.25 * 1 = -0.25; A0 = 0 + 0.25 * -0.25 = -0.0625
    # row 1: d = r (values 0): A2 = 2; A1 = 0 + 0.5; A0 = 1 + 0.125 = 1.125
    raw = torch.tensor([[-0.0625, -0.25, 1.0], [1.125, 0.5, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(returns, raw + values)
    flat = raw.flatten()
    torch.testing.assert_close(advantages, (raw - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8))


def test_whitening_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        masked_whiten(torch.ones(1, 3), torch.tensor([[0.0, 1.0, 0.0]]))


def test_last_token_rewards():
    scores = torch.tensor([2.0, -1.0, 5.0])
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    rewards = last_token_rewards(scores, mask)
    expected = torch.zeros(3, 6)
    expected[0, 3] = 2.0  # after the observation gap, before the padding
    expected[1, 0] = -1.0
    torch.testing.assert_close(rewards, expected)  # the row with no model token gets nothing


def test_clipped_value_loss_hand_worked():
    """Four tokens, clip 0.5 around the old values; the padded fifth token is ignored."""
    preds = torch.tensor([[1.0, 3.0, -1.0, 0.0, 100.0]])
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, clipfrac = clipped_value_loss(preds, returns, old, mask, 0.5)
    # clipped preds: 0.5, 0.5, -0.5, 0.0
    # unclipped (V-R)^2: 1, 9, 4, 0; clipped: 2.25, 0.25, 2.25, 0 -> max: 2.25, 9, 4, 0 (clipped larger on token 0)
    torch.testing.assert_close(loss, torch.tensor(0.5 * (2.25 + 9 + 4 + 0) / 4))
    torch.testing.assert_close(clipfrac, torch.tensor(0.25))


def test_value_loss_gradient_flows_through_the_unclipped_branch_only_where_it_is_larger():
    preds = torch.tensor([[1.0, 3.0]], requires_grad=True)
    loss, _ = clipped_value_loss(preds, torch.tensor([[2.0, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2), 0.5)
    loss.backward()
    # token 0: the clipped term (constant in V past the clip) wins -> 0 gradient; token 1: d/dV 0.5*(V-R)^2/2 = 1.5
    torch.testing.assert_close(preds.grad, torch.tensor([[0.0, 1.5]]))


def test_explained_variance():
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[0, 4:] = 0
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    live = returns[mask.bool()]
    mean_only = torch.full_like(returns, float(live.mean()))
    expected = 1 - float(live.var()) / (float(live.var()) + 1e-5)
    assert float(explained_variance(mean_only, returns, mask)) == pytest.approx(expected, rel=1e-9)
    assert abs(expected) < 1e-4
