"""RAGEN's system prompts for the environments (``env_prompt: ragen``, the default).

The texts are upstream's ``env_instruction`` strings (mll-lab-nu/RAGEN@20daedc config/envs.yaml: SimpleSokoban
lines 5-10, CoordSokoban 63-69, FrozenLake 168, CoordFrozenLake 178-182), assembled as upstream's context manager
does (ragen/llm_agent/ctx_manager.py:115-148, 541-545): "You're a helpful assistant. " + instruction, then for the
``grid`` format the symbol legend (``grid_vocab``), for ``coord`` upstream's coordinate hint, then the action list
and the per-episode action budget. The Coord* texts serve ``coord`` and ``grid_coord``, the plain ones ``grid``.

The one deliberate change: the Coord* texts state the board's true coordinate range; upstream's CoordFrozenLake
says (0, 0)-(5, 5) on a 4x4 board. ``env_prompt: detailed`` selects our own, longer rules text instead
(each environment's ``instructions()``: symbol legend, row/column directions, rewards, deadlock hint).
"""

from __future__ import annotations

from typing import Any

_RANGE = "Coordinates range from the top-left corner (0, 0) to the bottom-right corner ({r}, {c})."

INSTRUCTIONS = {
    ("sokoban", "grid"): (
        "You are solving the Sokoban puzzle. \n"
        "You are the player and you need to push all boxes to targets. \n"
        "When you are right next to a box, you can push it by moving in the same direction. \n"
        "You cannot push a box through a wall, and you cannot pull a box. \n"
        "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
    ),
    ("sokoban", "coord"): (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
        "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, "
        "and each target. \n"
        + _RANGE
        + " \n"
        "When you are exactly next to a box, you can push it by moving in the same direction. \n"
        "You cannot push a box through a wall, and you cannot pull a box.\n"
        "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
    ),
    ("frozenlake", "grid"): (
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the unintended "
        "direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to the target, I "
        "should go left then go up.</think><answer>Left || Up</answer>"
    ),
    ("frozenlake", "coord"): (
        "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed "
        "coordinates "
        "for the start, goal, player, and any holes.\n" + _RANGE + "\n"
        "Beware that the ice is slippery, so the agent might slide and end up in an unintended tile.\n"
        "Respond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
    ),
}

# Upstream's grid_vocab (ragen/env/sokoban/config.py:10, ragen/env/frozen_lake/config.py:23), in its order.
GRID_VOCAB = {
    "sokoban": {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
                "S": "player on target"},
    "frozenlake": {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole",
                   "√": "player on goal"},
}
COORD_HINT = (  # ctx_manager.py:133-139 (upstream appends it for observation_format coord, whatever the env)
    "\nStates are provided as coordinate lists using zero-based indexing with the format (row, col) for each entity "
    "type: Walls, Targets, Boxes, Boxes on target, Player, and Player on target when applicable."
)
PROMPT_STYLES = ("ragen", "detailed")


def ragen_instruction(env_name: str, observation_format: str, shape: tuple[int, int]) -> str:
    """Upstream's env_instruction for this environment and format, with the board's true coordinate range."""
    kind = "grid" if observation_format == "grid" else "coord"
    text = INSTRUCTIONS[(env_name, kind)]
    return text.replace("({r}, {c})", f"({shape[0] - 1}, {shape[1] - 1})")


def ragen_system_message(env: Any, max_actions_per_episode: int) -> str:
    """The system message RAGEN builds for ``env`` (see the module docstring)."""
    name, fmt = env.ragen_name, env.observation_format
    text = "You're a helpful assistant. " + ragen_instruction(name, fmt, env.shape)
    if fmt == "grid":
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
            f"{k}: {v}" for k, v in GRID_VOCAB[name].items()
        )
    if fmt == "coord":
        text += COORD_HINT
    text += "\nYour available actions are:\n" + ", ".join(env.action_names)
    text += f'\nYou can make up to {max_actions_per_episode} actions, separated by the action separator " || "\n'
    return text
