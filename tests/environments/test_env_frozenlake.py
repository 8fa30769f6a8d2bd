"""FrozenLake text environment: solvable and seeded maps, determinism across processes, slip statistics,
rewards and termination, exact rendering with the true board range, name handling and config validation."""

import math
import os
import random
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path

import pytest

from envs import make_env
from envs.episode import Episode
from envs.frozenlake import FrozenLakeEnv, derive_seeds, map_for_seed

REPO = Path(__file__).resolve().parents[2]
GYM_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's classic map
PATH_4X4 = ["Down", "Down", "Right", "Down", "Right", "Right"]  # a hole-free walk from S to G on GYM_4X4
CROSS = ["FFF", "FSF", "FFG"]  # start in the middle: all four neighbours are frozen


def _solvable(desc) -> bool:
    """Own BFS (not gymnasium's DFS): is G reachable from S through non-hole cells?"""
    rows, cols = len(desc), len(desc[0])
    start = next((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "S")
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return True
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) not in seen and desc[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


def _check_maps(seeds, through_env=True) -> None:
    for size in (4, 6, 8):
        for p in (0.8, 0.6):
            env = FrozenLakeEnv(size=size, p=p)
            for seed in seeds:
                if through_env:  # the map the environment plays is the one map_for_seed documents
                    env.reset(seed)
                    assert env.desc == map_for_seed(size, p, seed)
                desc = map_for_seed(size, p, seed)
                assert len(desc) == size and all(len(row) == size for row in desc)
                assert "".join(desc).count("S") == 1 and "".join(desc).count("G") == 1
                assert _solvable(desc), (size, p, seed, desc)


def test_generated_maps_are_solvable_and_seeded():
    _check_maps(range(100))  # 6 configurations x 100 seeds = 600 maps
    assert map_for_seed(6, 0.8, 7) == map_for_seed(6, 0.8, 7)
    assert len({map_for_seed(6, 0.8, s) for s in range(50)}) > 40  # the seed really changes the map


@pytest.mark.slow
def test_generated_maps_are_solvable_sweep():
    _check_maps(range(100, 5100), through_env=False)  # 30,000 maps


def test_seed_derivation_is_stable_and_accepts_any_int():
    assert derive_seeds(3) == derive_seeds(3) and derive_seeds(3) != derive_seeds(4)
    map_seed, slip_seed = derive_seeds(0)
    assert map_seed != slip_seed
    env = FrozenLakeEnv()
    for seed in (-1, 0, 2**70, True):
        assert "Board size" in env.reset(seed)  # unusual seeds never raise


_DIGEST_SCRIPT = r"""
import hashlib, json
from envs.frozenlake import FrozenLakeEnv, map_for_seed
maps = [map_for_seed(s, p, seed) for s in (4, 6, 8) for p in (0.8, 0.6) for seed in range(40)]
env = FrozenLakeEnv(size=6, success_rate=0.8, max_steps=1000)
trajs = []
for seed in range(20):
    obs = [env.reset(seed)]
    for name in ["Right", "Down"] * 6:
        obs.append(env.step([name]).observation)
    trajs.append(obs)
print(hashlib.sha256(json.dumps([maps, trajs]).encode()).hexdigest())
"""


def test_deterministic_across_processes_and_hash_seeds():
    digests = []
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        digests.append(out.stdout.strip())
    assert len(digests[0]) == 64 and digests[0] == digests[1]


def test_episode_is_a_pure_function_of_config_seed_actions():
    actions = ["Right", "Down", "Left", "Down", "Right", "Up"] * 3
    def play(env, seed):
        return [env.reset(seed)] + [env.step([a]).observation for a in actions]
    a, b = FrozenLakeEnv(size=5, success_rate=0.6), FrozenLakeEnv(size=5, success_rate=0.6)
    assert play(a, 11) == play(b, 11) == play(a, 11)  # fresh instance and reused instance agree
    fixed = FrozenLakeEnv(desc=CROSS, success_rate=0.5)
    assert len({tuple(play(fixed, s)) for s in range(20)}) > 1  # the seed drives the slips


# --- slip statistics ---------------------------------------------------------------------------------

# From CROSS's centre (1, 1) each action lands on a distinct neighbour.
_LANDING = {(1, 0): "Left", (2, 1): "Down", (1, 2): "Right", (0, 1): "Up"}
_PERPENDICULAR = {"Left": ("Up", "Down"), "Right": ("Up", "Down"), "Up": ("Left", "Right"), "Down": ("Left", "Right")}


def _landings(success_rate, action, trials, first_seed=0):
    env = FrozenLakeEnv(desc=CROSS, success_rate=success_rate)
    counts = Counter()
    for seed in range(first_seed, first_seed + trials):
        env.reset(seed)
        env.step([action])
        counts[_LANDING[env.position]] += 1
    return counts


def _check_rates(success_rate, action, trials):
    counts = _landings(success_rate, action, trials)
    side = (1 - success_rate) / 2
    def within(observed, prob):
        return abs(observed / trials - prob) <= 4 * math.sqrt(prob * (1 - prob) / trials)
    assert within(counts[action], success_rate), (counts, success_rate)
    for other in _PERPENDICULAR[action]:
        assert within(counts[other], side), (counts, success_rate)
    assert sum(counts[d] for d in (action, *_PERPENDICULAR[action])) == trials  # never slides backwards


@pytest.mark.parametrize("success_rate", [0.8, 0.5])
@pytest.mark.parametrize("action", ["Left", "Down", "Right", "Up"])
def test_slip_frequencies_match_success_rate(success_rate, action):
    _check_rates(success_rate, action, trials=2000)


@pytest.mark.slow
@pytest.mark.parametrize("success_rate", [0.95, 0.8, 0.5, 0.2])
def test_slip_frequencies_sweep(success_rate):
    for action in ("Left", "Down", "Right", "Up"):
        _check_rates(success_rate, action, trials=20000)


def test_success_rate_one_is_deterministic():
    for action in ("Left", "Down", "Right", "Up"):
        assert _landings(1.0, action, 300) == Counter({action: 300})
    assert "slippery" not in FrozenLakeEnv(success_rate=1.0).instructions()
    assert "probability 0.8" in FrozenLakeEnv(success_rate=0.8).instructions()


# --- rewards and termination -------------------------------------------------------------------------


def test_known_path_reaches_goal():
    env = FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0)
    env.reset(0)
    result = env.step(PATH_4X4[:4])
    assert (result.reward, result.done, result.info["success"]) == (0.0, False, False)
    result = env.step(PATH_4X4[4:] + ["Up"])  # the extra move after the goal is not executed
    assert (result.reward, result.done, result.info["success"]) == (1.0, True, True)
    assert result.info["executed"] == 2 and env.success and env.position == (3, 3)
    after = env.step(["Left", "Up"])
    assert (after.reward, after.done, after.info["executed"], env.position) == (0.0, True, 0, (3, 3))
    assert env._move(0) == (0.0, True, False)


def test_hole_ends_episode_without_reward():
    env = FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0)
    env.reset(0)
    result = env.step(["Down", "Right", "Down"])  # (1, 0) then the hole at (1, 1); the last move is skipped
    assert (result.reward, result.done, result.info["success"], result.info["executed"]) == (0.0, True, False, 2)
    assert env.position == (1, 1) and not env.success
    assert env.step(["Right"]).info["executed"] == 0 and env.position == (1, 1)


def test_max_steps_and_effective_moves():
    env = FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0, max_steps=3)
    env.reset(0)
    result = env.step(["Up", "Right", "Left", "Right"])  # Up bumps the edge: executed but not effective
    assert result.info["executed"] == 3 and result.info["effective"] == 2
    assert result.done and not result.info["success"] and env.position == (0, 0)
    env.reset(1)  # reset clears the step count
    assert not env.done


def test_names_are_case_insensitive_and_unknown_counted():
    env = FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0)
    env.reset(0)
    result = env.step(["down", " DOWN ", "Jump", "rIgHt", "", None])
    assert result.info["unknown"] == 3 and result.info["executed"] == 3 and env.position == (2, 1)


def test_before_reset_nothing_raises():
    env = FrozenLakeEnv()
    result = env.step(["Down"])
    assert result.done and result.info["executed"] == 0 and not env.success and "reset" in result.observation


def test_random_play_never_raises():
    rng = random.Random(0)
    vocabulary = ["Left", "down", "RIGHT", "Up", "north", "", "||", "Left || Up", "√", None, 3]
    for seed in range(60):
        env = FrozenLakeEnv(size=rng.choice([2, 4, 6]), p=rng.choice([0.6, 0.9]), success_rate=rng.random(),
                            observation_format=rng.choice(["grid", "coord", "grid_coord"]), max_steps=8)
        env.reset(seed)
        for _ in range(12):
            result = env.step([rng.choice(vocabulary) for _ in range(rng.randint(0, 3))])
            assert result.reward in (0.0, 1.0) and isinstance(result.observation, str)


# --- rendering ---------------------------------------------------------------------------------------

COORD_START = (  # RAGEN's coordinate block (mll-lab-nu/RAGEN@20daedc ragen/env/frozen_lake/utils.py:45-68)
    "Board size: 4 rows x 4 cols (zero-indexed).\n"
    "Start: (0, 0)\nGoal: (3, 3)\nPlayer: (0, 0)\nHoles: (1, 1), (1, 3), (2, 3), (3, 0)"
)
GRID_START = "P___\n_O_O\n___O\nO__G"


def test_render_exact_in_each_format():
    envs = {
        f: FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0, observation_format=f) for f in ("grid", "coord", "grid_coord")
    }
    assert envs["grid"].reset(0) == GRID_START
    assert envs["coord"].reset(0) == COORD_START
    assert envs["grid_coord"].reset(0) == "Coordinates: \n" + COORD_START + "\nGrid Map: \n" + GRID_START
    hole = envs["grid_coord"]
    assert hole.step(["Down", "Right"]).observation == "Coordinates: \n" + COORD_START.replace(
        "Player: (0, 0)", "Player in hole: (1, 1)") + (
        "\nGrid Map: \n____\n_X_O\n___O\nO__G"
    )
    goal = envs["grid_coord"]
    goal.reset(0)
    assert goal.step(PATH_4X4).observation == "Coordinates: \n" + COORD_START.replace(
        "Player: (0, 0)", "Player on goal: (3, 3)") + (
        "\nGrid Map: \n____\n_O_O\n___O\nO__√"
    )


def test_board_size_is_true_for_every_size():
    for size in (4, 6, 8):
        env = FrozenLakeEnv(size=size, observation_format="coord")
        line = f"Board size: {size} rows x {size} cols (zero-indexed)."
        assert env.reset(5).splitlines()[0] == line
        assert f"rows 0-{size - 1} from top to bottom, columns 0-{size - 1}" in env.instructions()
        assert size == 6 or "0-5" not in env.instructions()  # not RAGEN's fixed (0, 0)-(5, 5) range
    wide = FrozenLakeEnv(desc=["SFFFF", "FFHFG"], observation_format="coord")
    assert wide.reset(0).startswith("Board size: 2 rows x 5 cols (zero-indexed).")
    assert "Holes: (1, 2)" in wide.render() and "rows 0-1 from top to bottom, columns 0-4" in wide.instructions()


def test_instructions_and_registry():
    env = make_env("frozenlake", size=4, success_rate=0.8)
    assert isinstance(env, FrozenLakeEnv) and env.action_names == ("Left", "Down", "Right", "Up")
    text = env.instructions()
    for part in ("goal", "hole", "probability 0.8", "0.1 each", "√", "<answer>Left || Up</answer>"):
        assert part in text
    episode = Episode(FrozenLakeEnv(desc=GYM_4X4, success_rate=1.0), seed=0)
    assert "Left, Down, Right, Up" in episode.first_messages()[0]["content"]
    record = episode.play("<think>down</think><answer>Down || Down</answer>")
    assert record.executed == 2 and episode.env.position == (2, 0)


# --- configuration -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"size": 1}, "size"),
        ({"size": 4.0}, "size"),
        ({"p": 0}, "p must"),
        ({"p": 1.5}, "p must"),
        ({"p": float("nan")}, "p must"),
        ({"success_rate": -0.1}, "success_rate"),
        ({"success_rate": 1.01}, "success_rate"),
        ({"observation_format": "image"}, "observation_format"),
        ({"max_steps": 0}, "max_steps"),
        ({"desc": "SFFG"}, "desc"),
        ({"desc": ["SF", "FGF"]}, "desc"),
        ({"desc": ["SX", "FG"]}, "desc"),
        ({"desc": ["FF", "FG"]}, "desc"),
    ],
)
def test_config_validation_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FrozenLakeEnv(**kwargs)
