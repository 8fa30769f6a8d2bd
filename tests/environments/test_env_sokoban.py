"""Sokoban environment (envs/sokoban.py): generated levels are solvable and deterministic (also across
PYTHONHASHSEED), the dynamics and rewards match gym-sokoban on hand-made levels, the renders are exact, model
output never raises, and bad configurations name the argument at fault."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sokoban_solver import solve

from envs import make_env
from envs.episode import Episode, EpisodeSettings
from envs.sokoban import Level, SokobanEnv, _generate_cached, generate_level

REPO = Path(__file__).resolve().parents[2]


def _on_target(env: SokobanEnv) -> int:
    """Boxes on a target, read from the text the model sees (independent of the env's internals)."""
    return env.render().count("√")


def _replay(env: SokobanEnv, moves: list[str]) -> float:
    """Play ``moves`` one by one, checking each move's reward against gym-sokoban's rule; return the total."""
    total = 0.0
    for i, move in enumerate(moves):
        assert not env.done, f"episode ended early at move {i}"
        before = _on_target(env)
        result = env.step([move])
        delta = _on_target(env) - before  # one box at most moves per step: +1 on, -1 off, 0 otherwise
        expected = -0.1 + delta + (10.0 if result.info["success"] else 0.0)
        assert result.reward == pytest.approx(expected), (i, move)
        assert result.info["executed"] == 1
        total += result.reward
    return total


def _check_solvable(env: SokobanEnv, seeds) -> None:
    for seed in seeds:
        env.reset(seed)
        level = env.level
        assert not (level.boxes & level.targets), f"seed {seed}: a box starts on a target"
        moves = solve(level)
        assert moves, f"seed {seed}: no solution for\n{env.render()}"
        total = _replay(env, moves)
        assert env.success and env.done
        assert total == pytest.approx(10 + env.num_boxes - 0.1 * len(moves)), seed


# --- generated levels ------------------------------------------------------------------------------------


def test_default_levels_are_solvable_and_rewards_add_up():
    _check_solvable(SokobanEnv(), range(300))


@pytest.mark.parametrize("search_depth", [10, 30])
def test_larger_two_box_levels_are_solvable(search_depth):
    env = SokobanEnv(dim_room=(8, 8), num_boxes=2, search_depth=search_depth)
    _check_solvable(env, range(10))
    assert len(env.level.boxes) == 2 and (env.level.rows, env.level.cols) == (8, 8)


@pytest.mark.slow
def test_thousand_default_levels_are_solvable(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow sweep: run with -m slow")
    start = time.perf_counter()
    _check_solvable(SokobanEnv(), range(1000, 2000))
    _check_solvable(SokobanEnv(dim_room=(8, 8), num_boxes=2), range(300))
    print(
        f"1000 default + 300 8x8 two-box levels generated, solved and replayed in {time.perf_counter() - start:.1f}s"
    )


def test_generated_level_shape():
    env = SokobanEnv(dim_room=[7, 9], observation_format="grid")  # a list, as YAML recipes give it
    grid = env.reset(5)
    assert env.dim_room == (7, 9)
    assert [len(row) for row in grid.splitlines()] == [9] * 7
    border = {(r, c) for r in range(7) for c in range(9) if r in (0, 6) or c in (0, 8)}
    assert border <= env.level.walls
    assert Level.from_text(grid) == env.level  # the render is the level, symbol for symbol
    assert grid.count("P") + grid.count("S") == 1 and grid.count("X") == 1


def test_generation_failure_names_seed_and_config():
    # Two boxes cannot both leave their targets in a single reverse move.
    with pytest.raises(RuntimeError, match=r"seed=7.*num_boxes=2.*search_depth=1"):
        SokobanEnv(num_boxes=2, search_depth=1, max_generation_attempts=3).reset(7)


# --- determinism -----------------------------------------------------------------------------------------

DIGEST_SCRIPT = """
import hashlib
from envs.sokoban import SokobanEnv

def digest():
    h = hashlib.sha256()
    for env, seeds in ((SokobanEnv(), range(25)), (SokobanEnv(dim_room=(8, 8), num_boxes=2, search_depth=30), range(5))):
        for seed in seeds:
            h.update(env.reset(10_000 + seed).encode())
    return h.hexdigest()

if __name__ == "__main__":
    print(digest())
"""  # noqa: E501 (a string value: the script's long line stays as it is)


def test_levels_identical_across_processes_and_hash_seeds():
    digests = []
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [sys.executable, "-c", DIGEST_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        digests.append(out.stdout.strip())
    namespace = {"__name__": "in_process"}
    exec(DIGEST_SCRIPT, namespace)
    assert digests[0] == digests[1] == namespace["digest"]()


def test_generation_is_pure_and_leaves_global_rngs_alone():
    config = ((6, 6), 1, 300, None)
    first = [generate_level(*config, seed) for seed in range(30)]
    _generate_cached.cache_clear()
    random.seed(0)
    state = random.getstate()
    again = [generate_level(*config, seed) for seed in range(30)]
    assert random.getstate() == state  # no draw from the global RNG
    random.seed(999)  # and the global seed has no influence
    _generate_cached.cache_clear()
    assert again == first == [generate_level(*config, seed) for seed in range(30)]
    env = SokobanEnv()
    assert env.reset(3) == env.reset(3)


def test_different_seeds_give_different_levels():
    env = SokobanEnv(observation_format="grid")
    renders = {env.reset(seed) for seed in range(100)}
    assert len(renders) >= 90


# --- dynamics on hand-made levels ------------------------------------------------------------------------


def _env(text: str, **kwargs) -> SokobanEnv:
    env = SokobanEnv(**kwargs)
    env.load_level(Level.from_text(text))
    return env


def _move(env: SokobanEnv, name: str):
    result = env.step([name])
    return round(result.reward, 6), result.done, result.info["effective"]


def test_walk_push_off_push_on_and_solve():
    env = _env("""
#######
#P√__##
#___XO#
#######
""")
    assert not env.done and not env.success
    assert _move(env, "Right") == (-1.1, False, 1)  # box off its target: -0.1 - 1
    assert _move(env, "Up") == (-0.1, False, 0)  # wall bump: costs a step, changes nothing
    assert env.level.player == (1, 1) and env.steps == 2
    assert _move(env, "Down") == (-0.1, False, 1)
    assert _move(env, "Right") == (-0.1, False, 1)
    assert _move(env, "Right") == (0.9, False, 1)  # box onto a target: -0.1 + 1
    assert _move(env, "Up") == (-0.1, False, 1)
    assert _move(env, "Left") == (10.9, True, 1)  # last box on: -0.1 + 1 + 10
    assert env.success and env.done
    grid = env.render().split("Grid Map: \n")[1]
    assert grid == "#######\n#_√P_##\n#____√#\n#######"
    after = env.step(["Left", "Down"])  # moves after done do nothing
    assert (after.reward, after.done, after.info["executed"]) == (0.0, True, 0)
    assert env._move(0) == (0.0, True, False) and env.render().split("Grid Map: \n")[1] == grid


def test_target_to_target_push_nets_only_the_step_cost():
    env = _env("""
######
#P√O_#
#__X_#
######
""")
    assert _move(env, "Right") == (-0.1, False, 1)  # -0.1 + 1 - 1
    assert env.render().endswith("#_S√_#\n#__X_#\n######")  # the player now stands on a target


@pytest.mark.parametrize(
    "text",
    [
        "#####\n#PX##\n#O__#\n#####",  # box against a wall
        "######\n#PXX_#\n#OO__#\n######",  # two boxes in a row
    ],
    ids=["wall", "two-boxes"],
)
def test_blocked_push_changes_nothing(text):
    env = _env(text, observation_format="grid")
    assert _move(env, "Right") == (-0.1, False, 0)
    assert env.render() == text


def test_max_steps_ends_the_episode():
    env = _env("#####\n#P_O#\n#_X_#\n#___#\n#####", max_steps=3)
    result = env.step(["Up", "Left", "Up", "Up", "Up"])  # bumps; the third reaches max_steps
    assert result.done and not result.info["success"] and result.info["executed"] == 3
    assert result.reward == pytest.approx(-0.3)
    assert env.step(["Right"]).info["executed"] == 0


def test_action_names_are_case_insensitive_and_garbage_is_counted():
    env = _env("#####\n#P_O#\n#_X_#\n#___#\n#####", observation_format="grid")
    result = env.step(["rIGHT", " left ", "uP", "Down\n"])
    assert result.info == {"success": False, "executed": 4, "effective": 3, "unknown": 0}
    result = env.step(["jump", "", "Up Up", "<answer>", "Rightt", None, 3])
    assert result.info["unknown"] == 7 and result.info["executed"] == 0 and result.reward == 0.0
    assert env.action_names == ("Up", "Down", "Left", "Right")


# --- rendering and instructions --------------------------------------------------------------------------

SMALL = "#####\n#S_X#\n#_√_#\n#####"
SMALL_COORDS = (
    "Board size: 4 rows x 5 cols (zero-indexed).\n"  # upstream ragen/env/sokoban/utils.py:47-69
    "{walls}Targets: (1, 1), (2, 2)\nBoxes: (1, 3)\nBoxes on target: (2, 2)\nPlayer on target: (1, 1)"
)
SMALL_WALLS = (
    "Walls: (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 4), (2, 0), (2, 4), "
    "(3, 0), (3, 1), (3, 2), (3, 3), (3, 4)\n"
)


def test_render_formats_are_exact():
    assert _env(SMALL, observation_format="grid").render() == SMALL
    assert _env(SMALL, observation_format="coord").render() == SMALL_COORDS.format(walls=SMALL_WALLS)
    env = _env(SMALL)  # grid_coord, the default: walls only in the grid, as the reference does
    # upstream env.py:77: "Coordinates: \n" + coordinates + "\n" + "Grid Map: \n" + grid
    assert env.render() == "Coordinates: \n" + SMALL_COORDS.format(walls="") + "\nGrid Map: \n" + SMALL
    env.step(["Right"])
    assert env.render().splitlines()[5:] == ["Player: (1, 2)", "Grid Map: ", "#####", "#OPX#", "#_√_#", "#####"]


def test_render_before_reset_and_instructions_state_the_true_range():
    env = SokobanEnv(dim_room=(5, 7))
    assert env.done and not env.success and "reset" in env.render() and env.step(["Up"]).info["executed"] == 0
    text = env.instructions()
    assert "5 rows and 7 columns" in text and "0 (top) to 4 (bottom)" in text and "0 (left) to 6 (right)" in text
    assert "<answer>Right || Up</answer>" in text and "never pull" in text
    for symbol in "#_O√XPS":
        assert symbol in text
    env.load_level(Level.from_text(SMALL))  # the loaded board's size wins over the configured one
    assert "4 rows and 5 columns" in env.instructions()


# --- robustness and plumbing -----------------------------------------------------------------------------

NAMES = st.sampled_from(["Up", "Down", "Left", "Right", "up", " RIGHT ", "noop", "", "Up || Left"])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), moves=st.lists(NAMES, max_size=40), max_steps=st.integers(1, 30))
def test_random_play_never_raises_and_keeps_invariants(seed, moves, max_steps):
    env = SokobanEnv(max_steps=max_steps)
    env.reset(seed)
    level = env.level
    for name in moves:
        result = env.step([name])
        grid = result.observation.split("Grid Map: \n")[1]
        assert grid.count("X") + grid.count("√") == 1 and grid.count("P") + grid.count("S") == 1
        assert Level.from_text(grid).walls == level.walls and Level.from_text(grid).targets == level.targets
        assert env.steps <= max_steps and result.done == (env.success or env.steps >= max_steps)


def test_registered_and_playable_through_an_episode():
    env = make_env("sokoban", num_boxes=1, observation_format="grid")
    assert isinstance(env, SokobanEnv)
    episode = Episode(env, seed=11)
    assert (
        "The meaning of each symbol in the state is:" in episode.system_message() and "Turn 1" in episode.turn_block()
    )
    assert "Symbols" in Episode(env, 11, EpisodeSettings(prompt_style="detailed")).system_message()
    for response in ["garbage", "<think>go</think><answer>Up || Fly</answer>", "<think></think><answer>left</answer>"]:
        if episode.done:
            break
        episode.play(response)
    assert episode.turns[0].penalty == -0.1 and episode.turns[0].executed == 0


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"dim_room": (4, 6)}, "dim_room"),
        ({"dim_room": 6}, "dim_room"),
        ({"dim_room": (6, 6, 6)}, "dim_room"),
        ({"dim_room": (6.0, 6)}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": True}, "num_boxes"),
        ({"num_boxes": 15}, "num_boxes"),
        ({"search_depth": 0}, "search_depth"),
        ({"max_steps": 0}, "max_steps"),
        ({"num_gen_steps": 0}, "num_gen_steps"),
        ({"observation_format": "ascii"}, "observation_format"),
        ({"max_generation_attempts": 0}, "max_generation_attempts"),
    ],
)
def test_bad_config_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument) as excinfo:
        SokobanEnv(**kwargs)
    assert "e.g." in str(excinfo.value)  # and suggests a fix


@pytest.mark.parametrize(
    "text",
    ["", "#P#\n##", "#PXO#\n#_X_#", "#PP_XO#", "#P_XO?#", "#P_X_#"],
    ids=["empty", "ragged", "more-boxes-than-targets", "two-players", "unknown-symbol", "no-target"],
)
def test_bad_hand_made_levels_are_rejected(text):
    with pytest.raises(ValueError, match="Level"):
        Level.from_text(text)
