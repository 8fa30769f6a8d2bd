"""The collapse probe as RAGEN defines it (issue 20 item 5): Z located as text for tokenizers whose think tags are
several tokens, mapped back to the sampled ids; mi_zscore_ema = mean gap / (EMA of the marginal std + 1e-3).

Oracles are upstream's: Z's text is ``re.search(r"<think>(.*?)</think>", response).group(1).strip()`` on the reply
with the prefill in front (mll-lab-nu/RAGEN@20daedc ctx_manager.py:660-671), and the EMA z-score is ported from
collapse_metrics.py:303-342 below."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trainer.algorithms.collapse_metrics import mi_metrics
from trainer.methods.collapse.hook import CollapseDetector, first_turn_traces
from trainer.methods.collapse.reasoning_span import reasoning_token_span

# merges that straddle the tags (".</", "k>I should", " \n</"), as a real BPE can produce
CORPUS = ["k>I should", "k> the goal", "e.</", "ow \n</", "<th", "ink", "I should move the box left, then up.",
          "the goal is below"] * 20


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained here: '<think>' is several tokens whose merges can straddle the tag."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    assert len(fast.encode("<think>", add_special_tokens=False)) > 1
    return fast


REPLIES = ["I should move the box left, then up.</think><answer>Left || Up</answer>",
           "  the goal is below \n</think>\n<answer>Down</answer>",
           "<think>again: think</think><answer>Up</answer>",
           "no closing tag <answer>Up</answer>",
           "</think><answer>empty reasoning</answer>"]


def upstream_z(response: str) -> str | None:
    m = re.search(r"<think>(.*?)</think>", response, re.DOTALL)
    return m.group(1).strip() if m and m.group(1).strip() else None


@pytest.mark.parametrize("reply", REPLIES)
@pytest.mark.parametrize("split", [False, True])
def test_z_is_upstreams_reasoning_as_sampled_ids(bpe, reply, split):
    """Prefilled context: Z decodes to upstream's reasoning text and is a contiguous run of the sampled ids, also
    when the sampled ids are not the canonical tokenisation (split: tokenised character by character)."""
    ids = ([i for ch in reply for i in bpe.encode(ch, add_special_tokens=False)] if split
           else bpe.encode(reply, add_special_tokens=False))
    span = reasoning_token_span(bpe, ids, prefilled=True)
    expected = upstream_z("<think>" + reply)
    if expected is None:
        assert span is None
        return
    z = bpe.decode(ids[span[0]:span[1]])
    if split:
        assert z.strip() == expected
    else:  # a sampled token straddling '</think>' ('.</') takes its reasoning characters out of Z, nothing else
        assert expected.startswith(z.strip()) and len(expected) - len(z.strip()) <= 1


def test_first_turn_traces_use_the_text_path(bpe):
    prompt = bpe.encode("state A", add_special_tokens=False) + bpe.encode("<think>", add_special_tokens=False)
    reply = bpe.encode(REPLIES[0], add_special_tokens=False)
    traces, contexts, whole = first_turn_traces([prompt, prompt], [reply, bpe.encode("garbage")], None, None, bpe)
    assert not whole and traces[1] is None and contexts[0] == tuple(prompt)  # X ends with the prefill
    assert bpe.decode(list(traces[0].reasoning)) == "I should move the box left, then up"  # '.</' straddles
    no_prefill = bpe.encode("state A", add_special_tokens=False)
    traces, contexts, _ = first_turn_traces([no_prefill], [bpe.encode("<think>" + REPLIES[0])], None, None, bpe)
    assert contexts[0] == tuple(prompt) and traces[0] is not None  # RAGEN's canonical X = prompt + <think>


def upstream_ema_zscores(matrices: list[torch.Tensor], cols: torch.Tensor) -> list[float]:
    """collapse_metrics.py:303-342 on per-token log-prob matrices (population std, std_eps 1e-3, decay 0.9)."""
    store, out = None, []
    for L in matrices:
        matched = L.gather(1, cols.unsqueeze(1)).squeeze(1)
        marginal = torch.logsumexp(L, dim=1) - math.log(L.shape[1])
        std = marginal.std(unbiased=False).item()
        store = std if store is None else 0.9 * store + 0.1 * std
        out.append(((matched - marginal) / (store + 1e-3)).mean().item())
    return out


def test_mi_zscore_ema_is_upstreams():
    g = torch.Generator().manual_seed(0)
    cols = torch.tensor([0, 1, 2, 3, 0, 1])
    matrices = [torch.randn(6, 4, generator=g, dtype=torch.float64) * (1 + k) - 3 for k in range(4)]
    detector = CollapseDetector.__new__(CollapseDetector)
    detector._ema = {}
    ours = []
    for L in matrices:
        metrics = mi_metrics(L, cols)
        metrics.update({f"{k}_seq": v for k, v in mi_metrics(L * 5, cols).items()})
        ours.append(detector._ema_metrics(metrics, "first")["mi_zscore_ema"])
    assert ours == pytest.approx(upstream_ema_zscores(matrices, cols), rel=1e-9)


def test_a_model_that_never_thinks_keeps_the_whole_completion_mode(bpe):
    prompts = [bpe.encode("state A", add_special_tokens=False), bpe.encode("state B", add_special_tokens=False)]
    completions = [bpe.encode("Left", add_special_tokens=False), bpe.encode("Up", add_special_tokens=False)]
    traces, contexts, whole = first_turn_traces(prompts, completions, None, None, bpe)
    assert whole and [t.reasoning for t in traces] == [tuple(c) for c in completions]


def _detector(num_samples=64, max_tokens=10**9):
    d = CollapseDetector.__new__(CollapseDetector)
    d.num_samples, d.max_tokens, d.seed, d._ema, d._warned_budget = num_samples, max_tokens, 0, {}, False
    return d


def test_multi_turn_sample_is_trajectory_uniform_with_replacement():
    """RAGEN draws the episode uniformly, then a turn of it (collapse_trajectory_sample/*): an episode with one valid
    turn is drawn as often as one with nine (turn-uniform sampling would give it 10 %)."""
    from trainer.methods.collapse.hook import Trace

    traces = [Trace((0, 1), (5,), 0)] + [Trace((1, k), (6,), 1) for k in range(9)]
    d = _detector()
    draws = [t.episode for step in range(40) for t in d._trajectory_uniform(traces, 2, step)]
    assert len(draws) == 40 * 10  # min(num_samples, #valid turns) draws (collapse_metrics.py:815-819)
    share = draws.count(0) / len(draws)
    assert abs(share - 0.5) < 4 * math.sqrt(0.25 / len(draws))


def test_multi_turn_budget_keeps_traces_and_columns_together():
    """64 x 64 when the budget allows it; otherwise the largest K with K x (sum |X| + sum |Z|) <= budget, each draw
    still its own column (before: 64 columns and as few as 3 traces)."""
    from trainer.methods.collapse.hook import Trace

    traces = [Trace(tuple(range(m, m + 1500)), tuple(range(100)), m) for m in range(128)]
    draws = _detector()._trajectory_uniform(traces, 128, 1)
    assert len(draws) == 64 and len(_detector()._within_budget(draws)) == 64
    kept = _detector(max_tokens=262_144)._within_budget(draws)
    assert len(kept) == 12 and 12 * 12 * 1600 <= 262_144 < 13 * 13 * 1600
