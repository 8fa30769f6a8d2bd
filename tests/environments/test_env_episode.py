"""Hand-computed cases of the answer parser (envs/parsing.py) and the episode rules (envs/episode.py).

The fuzz test (tests/environments/test_env_fuzz.py) checks the same rules against an independent oracle on thousands of
hostile texts; these pin the documented behaviour case by case."""

from __future__ import annotations

import pytest
from line_env import Line

from envs.episode import NO_ACTION_WARNING, Episode, EpisodeSettings
from envs.levels import level_prompt, parse_level_prompt
from envs.parsing import parse_turn


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>go</think><answer>Right || Left</answer>", (True, ("Right", "Left"))),
        ("<think>go</think>\n  <answer> up ||  || down </answer>", (True, ("up", "down"))),
        ("<think>a</think><answer>A || B || C</answer>", (True, ("A", "B"))),  # truncated to max_actions
        ("<think>a</think> x <answer>Up</answer>", (False, ())),  # text between </think> and <answer>
        ("<think>never closed <answer>Up</answer>", (False, ())),
        ("<answer>Up</answer>", (False, ())),  # think required by default
        ("<think>a</think><answer>Up", (False, ())),
        ("<think>a</think><answer></answer>", (True, ())),
        ("<think>a</think><answer><|im_end|>Right<|im_start|></answer>", (True, ("Right",))),
        ("", (False, ())),
    ],
)
def test_parse_turn_cases(text, expected):
    parsed = parse_turn(text, max_actions=2)
    assert (parsed.format_ok, parsed.actions) == expected


def test_parse_turn_without_think_when_allowed_and_reasoning_text():
    assert parse_turn("<answer>Up || Left</answer>", 2, require_think=False).actions == ("Up", "Left")
    assert parse_turn("<think> plan \n</think><answer>Up</answer>", 2).thinking == "plan"
    assert parse_turn(None, 2).format_ok is False  # type: ignore[arg-type]


def _episode(**settings) -> Episode:
    return Episode(Line(), seed=0, settings=EpisodeSettings(**settings))


def test_valid_turns_move_and_sum_rewards():
    ep = _episode()
    record = ep.play("<think>r</think><answer>Right || right</answer>")
    assert (record.valid, record.executed, record.penalty) == (2, 2, 0.0)
    assert record.reward == pytest.approx(-0.2)
    assert ep.actions_left == 8 and not ep.done
    ep.play("<think>r</think><answer>RIGHT || Right</answer>")  # goal after the first: the second never runs
    assert ep.done and ep.success
    assert ep.turns[-1].executed == 1
    assert ep.episode_return == pytest.approx(-0.2 + 0.9)
    assert ep.summary() == {"episode_return": pytest.approx(0.7), "success": True, "num_turns": 2, "num_actions": 3,
                            "penalised_turns": 0}


def test_format_penalty_rules_and_warning():
    ep = _episode()
    bad = ep.play("no tags at all")
    assert (bad.valid, bad.executed, bad.penalty, bad.reward) == (0, 0, -0.1, 0.0)
    assert NO_ACTION_WARNING in ep.next_user_message()["content"]
    assert ep.next_user_message()["content"].startswith("Reward:\n0\n")  # upstream's int 0: no move ran
    mixed = ep.play("<think>r</think><answer>Right || Jump</answer>")  # known action runs, turn still penalised
    assert (mixed.valid, mixed.executed, mixed.penalty) == (1, 1, -0.1)
    assert NO_ACTION_WARNING not in ep.next_user_message()["content"]
    assert ep.episode_return == pytest.approx(-0.1 - 0.1 - 0.1)
    # the environment reward only, as upstream prints it (the -0.1 penalty is not in the line)
    assert ep.next_user_message()["content"].startswith("Reward:\n-0.1\n\nTurn 3:\nState:\n_P__\n")


def test_limits_end_the_episode():
    ep = _episode(max_turns=2)
    ep.play("x")
    ep.play("x")
    assert ep.done and len(ep.turns) == 2
    with pytest.raises(RuntimeError):
        ep.play("x")
    budget = _episode(max_actions_per_episode=1)
    turn = budget.play("<think>r</think><answer>Left || Right</answer>")  # only one action left: truncated, no penalty
    assert (turn.actions, turn.executed, turn.penalty) == (("Left",), 1, 0.0)
    assert budget.done and not budget.success


def test_prompts_state_the_rules():
    ep = _episode()
    system, user = ep.first_messages()
    assert "Walk to the right end." in system["content"] and "Left, Right" in system["content"]
    assert user["content"].startswith("\nTurn 1:\nState:\nP___\nYou have 10 actions left.")


def test_settings_validation():
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeSettings(max_turns=0)
    with pytest.raises(ValueError, match="format_penalty"):
        EpisodeSettings(format_penalty=0.5)


def test_level_prompt_round_trip_and_refusal():
    assert parse_level_prompt(level_prompt("sokoban", 10003)) == ("sokoban", 10003)
    with pytest.raises(ValueError, match="not an environment level prompt"):
        parse_level_prompt([{"role": "user", "content": "What is 2 + 3?"}])
