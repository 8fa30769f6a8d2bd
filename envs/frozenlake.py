"""FrozenLake as a text environment: walk from the start to the goal on a grid without falling into a hole.

Built on gymnasium's ``FrozenLakeEnv``: its transition table gives the dynamics (including the slip to a
perpendicular direction with probability ``(1 - success_rate) / 2`` each) and its ``np_random`` draws the
slips, so nothing about the physics is reimplemented here.

Maps are RAGEN's (mll-lab-nu/RAGEN@20daedc ragen/env/frozen_lake/utils.py:70-111, env.py:24,37): tiles frozen
with probability ``p`` (0.9 by default, config.py:9), start and goal at random *distinct* cells, redrawn until a
hole-free path joins them, all drawn from ``gymnasium.utils.seeding.np_random(seed)`` with the reset seed
itself -- so :func:`generate_map` returns upstream's very map for every seed. Written here rather than taken from
gymnasium's ``generate_random_map`` because that one fixes start and goal in the corners (mean shortest path 6
moves on 4x4 instead of upstream's 2.74).

Determinism: the map is a pure function of (size, p, seed); gymnasium's slip generator is seeded with a second
seed derived from ``seed`` by numpy's ``SeedSequence``, so an episode is a pure function of (constructor
arguments, seed, actions) -- no ``hash()``, no global RNG. (Upstream seeds the slips with the reset seed itself,
which replays the map generator's stream; the slip distribution is the same either way, and RAGEN's main-table
runs are not slippery.)

Text: observations are upstream's (``_render_text``, utils.py:45-68); the rules come from envs/prompts.py.
"""

from __future__ import annotations

import math
import operator
from numbers import Real
from typing import Any, Sequence

import numpy as np

from .base import TextEnv
from .registry import register_env

OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")
_TILES = frozenset("SFHG")
# Text symbols (RAGEN's): the start renders as plain ice, the player's symbol depends on the tile below it.
_SYMBOL = {"S": "_", "F": "_", "H": "O", "G": "G"}
_PLAYER_SYMBOL = {"S": "P", "F": "P", "H": "X", "G": "√"}


def derive_seeds(seed: int) -> tuple[int, int]:
    """(map seed, slip seed) for a reset seed: independent streams, identical in every process.

    Any integer is accepted; negative ones are taken modulo 2**64 (``SeedSequence`` wants a non-negative
    entropy) so a reset never raises on an unusual seed."""
    entropy = operator.index(seed) % 2**64
    map_child, slip_child = np.random.SeedSequence(entropy).spawn(2)
    return int(map_child.generate_state(1, np.uint64)[0]), int(slip_child.generate_state(1, np.uint64)[0])


def _has_path(board: np.ndarray, size: int) -> bool:
    """Whether the goal is reachable from the start through non-hole tiles (upstream's ``is_valid``)."""
    (start,) = zip(*np.where(board == "S"))
    frontier, seen = [start], set()
    while frontier:
        r, c = frontier.pop()
        if (r, c) in seen:
            continue
        seen.add((r, c))
        for nr, nc in ((r + 1, c), (r, c + 1), (r - 1, c), (r, c - 1)):
            if 0 <= nr < size and 0 <= nc < size:
                if board[nr][nc] == "G":
                    return True
                if board[nr][nc] != "H":
                    frontier.append((nr, nc))
    return False


def generate_map(size: int, p: float, seed: int) -> tuple[str, ...]:
    """RAGEN's random map for ``seed`` (see the module docstring): the same random draws in the same order as
    upstream's ``generate_random_map`` (board, start, goal; redrawn until start != goal and a path exists)."""
    from gymnasium.utils import seeding  # optional: gymnasium, the `envs` extra (Sokoban runs without it)

    rng, _ = seeding.np_random(operator.index(seed) % 2**64)  # seeding rejects negative seeds
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p])
        start = tuple(rng.integers(size, size=2))
        goal = tuple(rng.integers(size, size=2))
        if start != goal:
            board[start], board[goal] = "S", "G"
            if _has_path(board, size):
                return tuple("".join(row) for row in board)


def map_for_seed(size: int, p: float, seed: int) -> tuple[str, ...]:
    """The map :class:`FrozenLakeEnv` plays for ``reset(seed)`` with these ``size`` and ``p`` (RAGEN's map_seed is
    the reset seed, env.py:37). Not cached: ~0.1 ms on 4x4, below the ~1 ms of gymnasium's transition table."""
    return generate_map(size, p, seed)


def _check_desc(desc: Sequence[str]) -> tuple[str, ...]:
    """Validate a fixed map: equal-length rows over S/F/H/G with exactly one start and one goal."""
    if isinstance(desc, str) or not all(isinstance(row, str) for row in desc):
        raise ValueError("desc must be a list of strings, one per row (e.g. ['SFF', 'FHF', 'FFG'])")
    rows = tuple(desc)
    if not rows or not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        raise ValueError(f"desc must be non-empty rows of equal length (got row lengths {[len(r) for r in rows]})")
    bad = set("".join(rows)) - _TILES
    if bad:
        raise ValueError(f"desc may only contain S, F, H, G (found {sorted(bad)})")
    text = "".join(rows)
    if text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"desc needs exactly one S and one G (got {text.count('S')} S, {text.count('G')} G)")
    return rows


def _check_real(name: str, value: object, low: float, high: float, low_open: bool) -> float:
    """A finite real in [low, high] (or (low, high]); the error names the argument and the valid range."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {interval} (got {value!r})")
    return float(value)


def _check_int(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low} (got {value!r})")
    return value


@register_env("frozenlake")
class FrozenLakeEnv(TextEnv):
    """FrozenLake played by action names; see the module docstring.

    Arguments: ``size`` (side of the random square map, >= 2), ``p`` (probability a generated tile is
    frozen, in (0, 1]), ``success_rate`` (probability a move goes in the intended direction; 1.0 is
    deterministic), ``observation_format`` ("grid", "coord" or "grid_coord"), ``max_steps`` (primitive moves
    after which the episode ends unsolved, a safety limit) and ``desc`` (an optional fixed map as rows of
    S/F/H/G; when given, ``size`` and ``p`` are not used)."""

    action_names = ("Left", "Down", "Right", "Up")  # indices 0..3 are gymnasium's actions
    ragen_name = "frozenlake"  # envs/prompts.py: upstream's FrozenLake / CoordFrozenLake instruction texts

    def __init__(
        self,
        size: int = 4,
        p: float = 0.9,
        success_rate: float = 0.8,
        observation_format: str = "grid_coord",
        max_steps: int = 100,
        desc: Sequence[str] | None = None,
    ) -> None:
        self.size = _check_int("size", size, 2)  # size 1 would put S and G on one cell: gymnasium loops forever
        self.p = _check_real("p", p, 0.0, 1.0, low_open=True)
        self.success_rate = _check_real("success_rate", success_rate, 0.0, 1.0, low_open=False)
        if observation_format not in OBSERVATION_FORMATS:
            raise ValueError(f"observation_format must be one of {OBSERVATION_FORMATS} (got {observation_format!r})")
        self.observation_format = observation_format
        self.max_steps = _check_int("max_steps", max_steps, 1)
        self.fixed_desc = None if desc is None else _check_desc(desc)
        self._gym: Any = None  # gymnasium's FrozenLakeEnv, built on the first reset
        self._gym_desc: tuple[str, ...] | None = None
        self.desc: tuple[str, ...] = ()
        self.steps = 0
        self._terminated = False

    # --- geometry --------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the board this environment plays (known before the first reset)."""
        if self.fixed_desc is not None:
            return len(self.fixed_desc), len(self.fixed_desc[0])
        return self.size, self.size

    def _find(self, tile: str) -> list[tuple[int, int]]:
        return [(r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == tile]

    @property
    def position(self) -> tuple[int, int]:
        """The player's (row, col)."""
        if self._gym is None:
            raise RuntimeError("FrozenLakeEnv: call reset(seed) before using the environment")
        return divmod(int(self._gym.s), self.shape[1])

    # --- TextEnv ---------------------------------------------------------------------------------

    def reset(self, seed: int) -> str:
        """Build (or reuse) the board for ``seed``, seed gymnasium's slip generator, return the observation."""
        slip_seed = derive_seeds(seed)[1]
        desc = self.fixed_desc if self.fixed_desc is not None else map_for_seed(self.size, self.p, seed)
        if self._gym is None or desc != self._gym_desc:
            # The transition table costs ~1 ms on 8x8; a fixed board (or a repeated map) reuses it.
            slippery = self.success_rate < 1.0
            kwargs = {"success_rate": self.success_rate} if slippery else {}
            from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv  # optional: the `envs` extra

            self._gym = FrozenLakeEnv(desc=list(desc), is_slippery=slippery, **kwargs)
            self._gym_desc = desc
        self._gym.reset(seed=slip_seed)
        self.desc = desc
        self.steps = 0
        self._terminated = False
        return self.render()

    def _move(self, index: int) -> tuple[float, bool, bool]:
        """One gymnasium step; after the end (hole, goal or ``max_steps``) a move is a no-op."""
        if self.done:
            return 0.0, True, False
        before = int(self._gym.s)
        state, reward, terminated, _truncated, _info = self._gym.step(int(index))
        self.steps += 1
        self._terminated = bool(terminated)
        return float(reward), self.done, int(state) != before

    @property
    def done(self) -> bool:
        """Goal or hole reached, or ``max_steps`` moves made; also True before the first reset (nothing to play,
        so step() is a no-op there, as in envs/sokoban.py)."""
        return self._gym is None or self._terminated or self.steps >= self.max_steps

    @property
    def success(self) -> bool:
        """The player stands on the goal."""
        if self._gym is None:
            return False
        row, col = self.position
        return self.desc[row][col] == "G"

    def render(self) -> str:
        """The state in the configured format, as upstream renders it (env.py:64-82): the grid, the coordinate
        block, or "Coordinates: " + the block + "Grid Map: " + the grid."""
        if self._gym is None:
            return "(no level loaded: call reset(seed) first)"
        grid = self._grid_text()
        if self.observation_format == "grid":
            return grid
        coord = self._coord_text()
        if self.observation_format == "coord":
            return coord
        return "Coordinates: \n" + coord + "\n" + "Grid Map: \n" + grid

    def _grid_text(self) -> str:
        row_p, col_p = self.position
        return "\n".join(
            "".join((_PLAYER_SYMBOL if (r, c) == (row_p, col_p) else _SYMBOL)[ch] for c, ch in enumerate(row))
            for r, row in enumerate(self.desc)
        )

    def _coord_text(self) -> str:
        """Upstream's coordinate block (utils.py:14-68): board size, Start, Goal, the player, Holes (if any)."""
        pos = self.position
        tile = self.desc[pos[0]][pos[1]]
        player = {"G": "Player on goal", "H": "Player in hole"}.get(tile, "Player")
        rows, cols = self.shape
        lines = [
            f"Board size: {rows} rows x {cols} cols (zero-indexed).",
            f"Start: {_fmt(self._find('S')[0])}",
            f"Goal: {_fmt(self._find('G')[0])}",
            f"{player}: {_fmt(pos)}",
        ]
        holes = self._find("H")
        if holes:
            lines.append("Holes: " + ", ".join(map(_fmt, holes)))
        return "\n".join(lines)

    def instructions(self) -> str:
        """The rules: goal, holes, slipperiness (only when slippery), symbols, the true coordinate range."""
        rows, cols = self.shape
        lines = ["You are walking on a frozen lake. Reach the goal (G) without stepping into a hole (O)."]
        if self.success_rate < 1.0:
            side = (1.0 - self.success_rate) / 2.0
            lines.append(
                f"The ice is slippery: a move goes in the intended direction with probability {self.success_rate:g}; "
                f"otherwise you slide to one of the two perpendicular directions (probability {side:g} each)."
            )
        lines += [
            "Symbols: P is you, _ is frozen ice (safe, the start too), O is a hole, G is the goal, "
            "X means you fell into a hole, √ means you are on the goal.",
            f"Positions are (row, column), zero-indexed: rows 0-{rows - 1} from top to bottom, "
            f"columns 0-{cols - 1} from left to right. Up lowers the row, Down raises it, Left lowers the column, "
            "Right raises it; a move off the edge leaves you in place.",
            "Reaching the goal gives reward 1, everything else 0. The game ends at the goal or in a hole.",
            "Example answer: <think>The goal is to my left and above me.</think><answer>Left || Up</answer>",
        ]
        return "\n".join(lines)


def _fmt(cell: tuple[int, int]) -> str:
    return f"({cell[0]}, {cell[1]})"
