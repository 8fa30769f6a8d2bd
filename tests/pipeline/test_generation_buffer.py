"""winnow's generation buffer (trainer/pipeline/round.py): when a batch is due, which micro-batch each
micro-step takes, and, through the real trainer, that TRL's own buffer is never filled -- the micro-batches trained
come from winnow's buffer and its counter, which ends a run at global_step x gradient_accumulation_steps as TRL's
counter would."""

from __future__ import annotations

import pytest
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_length, reward_token_parity

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.pipeline.round import GenerationBuffer


class Dealt:
    """A round that has dealt its micro-batches (the buffer reads nothing else of it)."""

    def __init__(self, micro_batches):
        self.micro_batches = micro_batches


def test_a_batch_is_due_every_steps_per_generation_times_num_iterations_micro_steps():
    buf = GenerationBuffer(steps_per_generation=3, num_iterations=2)
    assert buf.due()  # nothing buffered yet
    due_at, picked = [], []
    for micro in range(13):
        if buf.due():
            due_at.append(micro)
            buf.fill(Dealt([{"i": i, "batch": len(due_at)} for i in range(3)]))
        picked.append((buf.current()["batch"], buf.current()["i"]))
        buf.advance()
    assert due_at == [0, 6, 12]
    # each batch's 3 micro-batches in order, twice (num_iterations), then the next batch
    assert picked[:7] == [(1, 0), (1, 1), (1, 2), (1, 0), (1, 1), (1, 2), (2, 0)]
    assert buf.at_batch_boundary() is False and buf.micro_step == 13


def test_a_resumed_counter_inside_a_batch_needs_its_batch_and_on_a_boundary_generates():
    buf = GenerationBuffer(steps_per_generation=4, num_iterations=1)
    buf.load_state_dict({"micro_step": 6})
    assert buf.state_dict() == {"micro_step": 6} and buf.due()  # nothing buffered: the resume must fill it
    buf.fill(Dealt([{"i": i} for i in range(4)]))
    assert not buf.due() and buf.current() == {"i": 2}
    buf.advance()
    buf.advance()
    assert buf.at_batch_boundary() and buf.due()


def test_a_batch_of_the_wrong_length_and_an_empty_buffer_are_refused():
    buf = GenerationBuffer(steps_per_generation=2, num_iterations=1)
    with pytest.raises(RuntimeError, match="no generation batch is buffered"):
        buf.current()
    buf.fill(Dealt([{}]))
    with pytest.raises(ValueError, match="steps_per_generation=2"):
        buf.current()


@pytest.mark.parametrize("dropout", ["none", "grpodropout"])
def test_the_trainer_trains_from_its_own_buffer_not_trls(tiny_model, tmp_path, dropout):
    """Two generation batches of two optimizer steps each (S = 4, A = 2), with and without a stage that removes rows
    (step dealing): TRL's ``_buffered_inputs`` stays empty, and the counter ends at global_step x A."""
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 4,
                        "gradient_accumulation_steps": 2, "steps_per_generation": 4, "max_steps": 4,
                        "rollout_dropout": dropout})
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args,
                           train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    generated = []
    generate = tr._generate_and_score_completions
    tr._generate_and_score_completions = lambda inputs: generated.append(1) or generate(inputs)
    tr.train()
    assert tr._buffered_inputs is None, "winnow must not fill TRL's private buffer"
    assert tr.state.global_step == 4 and tr.generation_buffer.micro_step == 4 * 2
    assert len(generated) == 2 and len(tr.generation_buffer.micro_batches) == 4
