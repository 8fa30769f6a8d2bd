"""One gather per key of a generation batch (trainer/pipeline/batch.py): the stages' batch, compaction and the
other readers share one GatheredRows, so a key crosses the processes once; what they read equals each key's own
gather, padded as TRL pads it. Two processes played by threads, ranks of different widths."""

from __future__ import annotations

import torch
from thread_world import ThreadWorld

from trainer.pipeline.batch import GatheredRows, gather_key, row_keys
from trainer.pipeline.round import compact

PAD = 7
WORLD, B = 2, 4


def _rank_batch(rank: int) -> dict[str, torch.Tensor]:
    """TRL-shaped local rows: rank r's completions are 3 + r columns wide (so gathering pads), right-padded."""
    g = torch.Generator().manual_seed(rank)
    T = 3 + rank
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    tool_mask = completion_mask.clone()
    tool_mask[0, 0] = 0  # one environment token
    return {
        "prompt_ids": torch.randint(10, 99, (B, 2), generator=g),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.where(completion_mask.bool(), torch.randint(10, 99, (B, T), generator=g), PAD),
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.randn(B, generator=g),
    }


def test_a_key_is_gathered_once_and_is_its_own_gather():
    batches = [_rank_batch(r) for r in range(WORLD)]

    def fn(rank, acc):
        output = batches[rank]
        rows = GatheredRows(output, acc, PAD)
        ids, again, mask = rows["completion_ids"], rows["completion_ids"], rows.loss_mask()
        gathers = rows.gathers
        direct = {k: gather_key(acc, k, output[k], PAD) for k in ("completion_ids", "completion_mask", "tool_mask")}
        output["tool_mask"] = output["tool_mask"] * 1  # replaced in the local dict: the next read gathers again
        rows["tool_mask"]
        return ids is again, gathers, rows.gathers, ids, mask, direct

    for same, gathers, after, ids, mask, direct in ThreadWorld(WORLD).run(fn):
        assert same and gathers == 3 and after == 4  # ids, completion mask, tool mask; then the replaced tool mask
        assert ids.shape == (WORLD * B, 4) and torch.equal(ids, direct["completion_ids"])
        assert int((ids[:B, 3] == PAD).sum()) == B  # rank 0's rows padded with TRL's pad token
        torch.testing.assert_close(mask, direct["completion_mask"] * direct["tool_mask"], rtol=0, atol=0)


def test_compaction_reads_the_shared_rows_and_deals_the_same():
    keep = torch.tensor([True, False, True, True, False, True, False, True])

    def fn(rank, acc):
        shared_output, own_output = _rank_batch(rank), _rank_batch(rank)
        rows = GatheredRows(shared_output, acc, PAD)
        rows["completion_ids"], rows.loss_mask()  # what the stages' batch reads first
        advantages = torch.arange(WORLD * B, dtype=torch.float32)
        shared = compact(shared_output, keep, advantages, accelerator=acc, pad_token_id=PAD, steps_per_generation=2,
                         micro_batch_rows=2, gathered=rows)
        own = compact(own_output, keep, advantages, accelerator=acc, pad_token_id=PAD, steps_per_generation=2,
                      micro_batch_rows=2)
        return shared, own, rows.gathers, len(row_keys(shared_output))

    for shared, own, gathers, keys in ThreadWorld(WORLD).run(fn):
        assert gathers == keys  # every row key once, the stages' reads included
        assert shared.keys() == own.keys()
        for key in own:
            assert torch.equal(shared[key], own[key]), key
