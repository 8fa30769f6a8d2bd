"""System prompts and observations as RAGEN writes them (issue 20 item 6). Expected strings are upstream's:
the env_instruction texts of mll-lab-nu/RAGEN@20daedc config/envs.yaml (copied verbatim below, as YAML parses them),
assembled as ragen/llm_agent/ctx_manager.py:115-148 and 541-545 do; the one deliberate change is CoordFrozenLake's
coordinate range, (0, 0)-(3, 3) on the 4x4 board instead of upstream's (5, 5)."""

from __future__ import annotations

import pytest

from envs.episode import Episode, EpisodeSettings
from envs.frozenlake import FrozenLakeEnv
from envs.sokoban import SokobanEnv

# config/envs.yaml as yaml.safe_load returns it
COORD_SOKOBAN = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\nYou are "
    "provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each target. \n"
    "Coordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \nWhen you are "
    "exactly next to a box, you can push it by moving in the same direction. \nYou cannot push a box through a "
    "wall, and you cannot pull a box.\nThe answer should be a sequence of actions, like "
    "<answer>Right || Right || Up</answer>.\n"
)
SIMPLE_SOKOBAN = (
    "You are solving the Sokoban puzzle. \nYou are the player and you need to push all boxes to targets. \nWhen you "
    "are right next to a box, you can push it by moving in the same direction. \nYou cannot push a box through a "
    "wall, and you cannot pull a box. \nThe answer should be a sequence of actions, like "
    "<answer>Right || Right || Up</answer>\n"
)
COORD_FROZENLAKE = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed coordinates "
    "for the start, goal, player, and any holes.\nCoordinates range from the top-left corner (0, 0) to the "
    "bottom-right corner (5, 5).\nBeware that the ice is slippery, so the agent might slide and end up in an "
    "unintended tile.\n"
    "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)
FROZENLAKE = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the unintended "
    "direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to the target, I "
    "should go left then go up.</think><answer>Left || Up</answer>"
)
ACTIONS = (
    '\nYour available actions are:\n{}\nYou can make up to 10 actions, separated by the action separator " || "\n'
)


@pytest.mark.parametrize("env, expected", [
    (SokobanEnv(observation_format="grid_coord"), "You're a helpful assistant. " + COORD_SOKOBAN
     + ACTIONS.format("Up, Down, Left, Right")),
    (SokobanEnv(observation_format="grid"), "You're a helpful assistant. " + SIMPLE_SOKOBAN
     + "\nThe meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, X: box, "
     "P: player, S: player on target" + ACTIONS.format("Up, Down, Left, Right")),
    (FrozenLakeEnv(observation_format="grid_coord"), "You're a helpful assistant. "
     + COORD_FROZENLAKE.replace("(5, 5)", "(3, 3)") + ACTIONS.format("Left, Down, Right, Up")),
    (FrozenLakeEnv(observation_format="grid"), "You're a helpful assistant. " + FROZENLAKE
     + "\nThe meaning of each symbol in the state is:\nP: player, _: empty, O: hole, G: goal, X: player in hole, "
     "√: player on goal" + ACTIONS.format("Left, Down, Right, Up")),
])
def test_system_message_is_upstreams(env, expected):
    assert Episode(env, 10000, EpisodeSettings()).system_message() == expected


def test_detailed_prompt_is_opt_in():
    env = SokobanEnv()
    detailed = Episode(env, 10000, EpisodeSettings(prompt_style="detailed")).system_message()
    assert "corner" in detailed and "Symbols:" in detailed and detailed != Episode(env, 10000).system_message()
    with pytest.raises(ValueError, match="prompt_style"):
        EpisodeSettings(prompt_style="fancy")


def test_reward_line_is_the_environment_reward_as_upstream_prints_it():
    """ctx_manager.py:1345-1346 prints the turn's accumulated env reward: int 0 when no action ran, else Python's
    float text; the format penalty is not in it (es_manager.py:183-203, 233-237)."""
    ep = Episode(SokobanEnv(), 10000, EpisodeSettings())
    ep.play("<think>x</think><answer>Up || Up</answer>")  # two moves, -0.1 each (wall bumps included)
    assert ep.next_user_message()["content"].startswith(
        f"Reward:\n{0 + -0.1 + -0.1}\n\nTurn 2:\nState:\nCoordinates: \n"
    )
    ep.play("nothing")  # no action: penalised, reward line 0
    assert ep.next_user_message()["content"].startswith("Reward:\n0\n\nTurn 3:")
    ep.play("<think>x</think><answer>Up || Fly</answer>")  # one known move + an unknown name: -0.1, penalty not shown
    assert ep.next_user_message()["content"].startswith("Reward:\n-0.1\n")
