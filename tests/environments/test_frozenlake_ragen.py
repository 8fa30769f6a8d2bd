"""FrozenLake as RAGEN plays it (issue 20 item 1): the map distribution and the observation text of
mll-lab-nu/RAGEN@20daedc (ragen/env/frozen_lake/{config,utils,env}.py).

The references are upstream's, not this code's: maps printed by upstream's ``generate_random_map`` for fixed
seeds, and the map statistics computed *exactly* from upstream's generator logic (every hole pattern and
start/goal pair enumerated and weighted by the probability of upstream's rejection loop accepting it), which shares
no code with envs/frozenlake.py.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from envs.frozenlake import FrozenLakeEnv, generate_map

# Printed by upstream's generate_random_map(4, 0.9, seed) (ragen/env/frozen_lake/utils.py:89-111, run on its own).
UPSTREAM_MAPS = {
    10000: ("FFFF", "FFFF", "FFFF", "GSFF"),
    10001: ("FGFF", "FFFH", "SFHF", "FFFF"),
    10002: ("FSFF", "GFFF", "FFHF", "HFFF"),
    10003: ("FFHF", "FFFF", "SGFF", "FFFF"),
    123: ("FFFF", "FFHS", "GFFF", "FFFF"),
    124: ("HFFG", "FFFF", "FFFF", "FHFS"),
    0: ("FFGS", "FHFF", "FHFF", "FFFF"),
    1: ("FHFH", "FGFF", "FFFF", "SFFF"),
}


@pytest.mark.parametrize("seed", sorted(UPSTREAM_MAPS))
def test_map_is_upstreams_map_for_the_seed(seed):
    assert generate_map(4, 0.9, seed) == UPSTREAM_MAPS[seed]
    env = FrozenLakeEnv()  # defaults: upstream's size 4, p 0.9
    env.reset(seed)
    assert env.desc == UPSTREAM_MAPS[seed]


def exact_upstream_statistics(size: int, p: float, max_moves: int) -> tuple[float, float, float]:
    """(mean, std of the shortest start->goal path, P(path <= max_moves)) under upstream's generator, exactly.

    Upstream draws every tile F/H with probabilities (p, 1 - p), then start and goal uniformly, and retries until
    start != goal and a hole-free path exists; the start and goal tiles are overwritten. So a map is accepted
    with probability proportional to p^(#frozen other tiles) (1 - p)^(#holes) over the pairs start != goal with a
    path. Enumerated with bit masks (bit i = tile i not a hole): breadth-first layers per start."""
    n, full = size * size, (1 << size * size) - 1
    masks = np.arange(1 << n, dtype=np.int64)
    left = sum(1 << (r * size) for r in range(size))
    right = sum(1 << (r * size + size - 1) for r in range(size))
    frozen = np.array([bin(m).count("1") for m in range(1 << n)])

    def neighbours(x):
        return (((x & ~right) << 1) | ((x & ~left) >> 1) | (x << size) | (x >> size)) & full

    total = weighted = weighted_sq = near = 0.0
    for s in range(n):
        has_s = (masks >> s) & 1 == 1
        dist = np.full((1 << n, n), -1, np.int64)
        reached = np.where(has_s, 1 << s, 0)
        frontier, k = reached.copy(), 0
        while True:
            k += 1
            new = neighbours(frontier) & masks & ~reached
            if not new.any():
                break
            for g in range(n):
                dist[((new >> g) & 1) == 1, g] = k
            reached |= new
            frontier = new
        for g in range(n):
            if g == s:
                continue
            d = dist[:, g]
            ok = has_s & ((masks >> g) & 1 == 1) & (d > 0)
            w = np.where(ok, p ** (frozen - 2.0) * (1 - p) ** (n - frozen), 0.0)
            total += w.sum()
            weighted += (w * d).sum()
            weighted_sq += (w * d * d).sum()
            near += w[d <= max_moves].sum()
    mean = weighted / total
    return mean, math.sqrt(weighted_sq / total - mean**2), near / total


def shortest_path(desc) -> int:
    size = len(desc)
    start = next((r, c) for r in range(size) for c in range(size) if desc[r][c] == "S")
    queue, seen = deque([(start, 0)]), {start}
    while queue:
        (r, c), d = queue.popleft()
        if desc[r][c] == "G":
            return d
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and desc[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append(((nr, nc), d + 1))
    raise AssertionError(f"no path on {desc}")


def test_map_statistics_match_upstreams_distribution():
    """2,000 training seeds: mean shortest path and the share solvable within one turn (2 moves) within 4
    standard errors of upstream's exact values (4x4, p 0.9: mean 2.739 moves, 47.3 % within one turn; gymnasium's
    corner-to-corner generator used before gives 6 moves and 0 %)."""
    mean, std, near = exact_upstream_statistics(4, 0.9, max_moves=2)
    assert mean == pytest.approx(2.7389, abs=1e-3) and near == pytest.approx(0.4726, abs=1e-3)
    paths = np.array([shortest_path(generate_map(4, 0.9, seed)) for seed in range(10_000, 12_000)])
    n = len(paths)
    assert abs(paths.mean() - mean) < 4 * std / math.sqrt(n), (paths.mean(), mean)
    share = (paths <= 2).mean()
    assert abs(share - near) < 4 * math.sqrt(near * (1 - near) / n), (share, near)


def test_map_is_a_pure_function_of_config_and_seed():
    assert generate_map(4, 0.9, 77) == generate_map(4, 0.9, 77)
    assert len({generate_map(4, 0.9, s) for s in range(200)}) > 150
    assert generate_map(4, 0.9, -5) == generate_map(4, 0.9, 2**64 - 5)  # negative seeds are accepted


DESC = ("SFFF", "FHFH", "FFFH", "HFFG")


def test_observation_text_is_upstreams():
    """Strings written from upstream's _render_text / format_coordinate_render (env.py:64-82, utils.py:45-68)."""
    env = FrozenLakeEnv(desc=DESC, success_rate=1.0, observation_format="grid_coord")
    env.reset(0)
    assert env.render() == (
        "Coordinates: \n"
        "Board size: 4 rows x 4 cols (zero-indexed).\n"
        "Start: (0, 0)\nGoal: (3, 3)\nPlayer: (0, 0)\nHoles: (1, 1), (1, 3), (2, 3), (3, 0)\n"
        "Grid Map: \n"
        "P___\n_O_O\n___O\nO__G"
    )
    env.step(["Down", "Right"])  # into the hole at (1, 1)
    assert "Player in hole: (1, 1)\nHoles:" in env.render() and "\n_X_O\n" in env.render()
    no_holes = FrozenLakeEnv(desc=("SF", "FG"), success_rate=1.0, observation_format="coord")
    no_holes.reset(0)
    no_holes.step(["Down", "Right"])
    assert no_holes.render() == ("Board size: 2 rows x 2 cols (zero-indexed).\n"
                                 "Start: (0, 0)\nGoal: (1, 1)\nPlayer on goal: (1, 1)")  # no "Holes" line
