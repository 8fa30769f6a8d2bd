"""Fuzz envs/parsing.py and envs/episode.py with the seeded hostile corpus (tests/hostile_outputs.py).

Every text is played as one turn of an :class:`Episode` (a new episode, on a fresh environment, whenever the
last one is done) on each environment: a small grid walker defined here, Sokoban and FrozenLake. Checked on
every turn:

- nothing raises;
- ``parse_turn`` equals an independent reference of the grammar (:func:`oracle_parse`: anchored regexes with
  possessive tempered tokens instead of ``str.find``, a hand-written scanner for the special tokens) for texts
  up to :data:`ORACLE_MAX_CHARS`; longer ones are only required to return (their time is recorded and printed);
- the turn's record follows episode.py's rules exactly: actions truncated to min(max_actions_per_turn, actions
  left) *before* the check, penalty iff no action or any action unknown to the environment (names compared
  case-insensitively), ``env.step`` called once with exactly the known names (or not at all), state and
  observation unchanged plus the warning after a turn without a known action, ``actions_left`` and ``done``;
- ``episode_return`` == Σ rewards that ``env.step`` returned + Σ expected penalties;
- the same texts and seeds give the same returns twice.

Worst per-call times of ``parse_turn`` and ``Episode.play`` are printed (run with ``-s``), never asserted.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pytest
from hostile_outputs import CLASSES, N_HUGE_VARIANTS, hostile_outputs, huge_text, schedule

from envs.base import TextEnv
from envs.episode import NO_ACTION_WARNING, Episode, EpisodeSettings
from envs.frozenlake import FrozenLakeEnv
from envs.parsing import ParsedTurn, parse_turn
from envs.sokoban import SokobanEnv

ORACLE_MAX_CHARS = 200_000  # the reference grammar runs on texts up to this length; longer ones only have to return
CI_TEXTS = 2_000  # per (environment, settings) case in the default run
SLOW_TEXTS = 10_000  # per environment in the slow run

# --- the reference grammar -----------------------------------------------------------------------------------

# First <think>, reasoning up to the first </think> after it, only whitespace, <answer>, answer up to the first
# </answer>. Possessive tempered tokens pin every "first occurrence" (no backtracking to a later tag).
_WITH_THINK = re.compile(
    r"(?:(?!<think>).)*+<think>((?:(?!</think>).)*+)</think>\s*+<answer>((?:(?!</answer>).)*+)</answer>", re.S
)
# No <think> anywhere: the first <answer> ... first </answer> (only when the think block is optional).
_WITHOUT_THINK = re.compile(r"(?!.*<think>)(?:(?!<answer>).)*+<answer>((?:(?!</answer>).)*+)</answer>", re.S)
_NO = ParsedTurn(False, "", "", ())


def oracle_strip_special(text: str) -> str:
    """Remove chat special tokens: ``<|`` + 1..40 characters that are not ``|``, ``<``, ``>`` or whitespace + ``|>``,
    scanned left to right, one pass (a removal never creates a token that is then removed)."""
    out, i, n = [], 0, len(text)
    while True:
        j = text.find("<|", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        k, limit = j + 2, min(n, j + 2 + 41)
        while k < limit and text[k] not in "|<>" and not text[k].isspace():
            k += 1
        if 1 <= k - (j + 2) <= 40 and text.startswith("|>", k):
            out.append(text[i:j])
            i = k + 2
        else:
            out.append(text[i : j + 1])
            i = j + 1


def oracle_parse(text: object, max_actions: int, require_think: bool = True, separator: str = "||") -> ParsedTurn:
    """Reference implementation of the grammar in envs/parsing.py's module docstring."""
    if not isinstance(text, str) or max_actions < 1:
        return _NO
    m = _WITH_THINK.match(text)
    if m is not None:
        thinking, inner = m.group(1), m.group(2)
    elif not require_think and (m := _WITHOUT_THINK.match(text)) is not None:
        thinking, inner = "", m.group(1)
    else:
        return _NO
    answer = oracle_strip_special(inner)
    parts = [part.strip() for part in re.split(re.escape(separator), answer)]
    return ParsedTurn(
        True, oracle_strip_special(thinking).strip(), answer.strip(), tuple(p for p in parts if p)[:max_actions]
    )


def expected_penalty(actions: Sequence[str], names: Sequence[str], penalty: float) -> tuple[float, list[str]]:
    """episode.py's rule: the penalty iff no action or any action unknown (case-insensitive); the known names."""
    lowered = {name.lower() for name in names}
    known = [a for a in actions if a.strip().lower() in lowered]
    return (penalty if not actions or len(known) != len(actions) else 0.0), known


# --- a small environment of our own ----------------------------------------------------------------------------


class WalkEnv(TextEnv):
    """A 4x4 walk to a goal past a pit and a wall; the level is a pure function of the seed."""

    action_names = ("Up", "Down", "Left", "Right")
    _DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))

    def __init__(self, size: int = 4, max_steps: int = 9) -> None:
        self.size, self.max_steps = size, max_steps

    def reset(self, seed: int) -> str:
        rng = random.Random(f"walk:{seed}")
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        self.pos, self.goal, self.pit, self.wall = rng.sample(cells, 4)
        self.steps, self._done, self._success = 0, False, False
        return self.render()

    def _move(self, index: int) -> tuple[float, bool, bool]:
        dr, dc = self._DELTAS[index]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        self.steps += 1
        changed = 0 <= r < self.size and 0 <= c < self.size and (r, c) != self.wall
        if changed:
            self.pos = (r, c)
        if self.pos == self.goal:
            self._done = self._success = True
            return 1.0, True, changed
        if self.pos == self.pit:
            self._done = True
            return -0.5, True, changed
        self._done = self.steps >= self.max_steps
        return -0.03, self._done, changed

    def render(self) -> str:
        marks = {self.goal: "G", self.pit: "O", self.wall: "#", self.pos: "P"}
        return "\n".join("".join(marks.get((r, c), "_") for c in range(self.size)) for r in range(self.size))

    def instructions(self) -> str:
        return "Walk P to G; avoid O; # is a wall."

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool:
        return self._success


ENVS: dict[str, Callable[[], TextEnv]] = {"walk": WalkEnv, "sokoban": SokobanEnv, "frozenlake": FrozenLakeEnv}
SETTINGS = {
    "default": EpisodeSettings(),  # 5 turns, 2 actions per turn, 10 per episode
    "wide": EpisodeSettings(max_turns=7, max_actions_per_turn=4, max_actions_per_episode=6, format_penalty=-0.25,
                            require_think=False),
}
MUST_PARSE = {"well_formed", "valid_mixed_case"}
MUST_PENALISE = {"empty", "whitespace_only", "separators_only", "unknown_actions"}

# --- the fuzz driver -------------------------------------------------------------------------------------------


@dataclass
class Worst:
    seconds: float = 0.0
    what: str = ""

    def update(self, seconds: float, cls: str, text: str) -> None:
        if seconds > self.seconds:
            self.seconds, self.what = seconds, f"{cls}, {len(text):,} chars"

    def __str__(self) -> str:
        return f"{self.seconds * 1e3:.2f} ms ({self.what})"


@dataclass
class FuzzRun:
    outcomes: list[tuple] = field(default_factory=list)  # per episode: (seed, return, success, turns)
    turns: int = 0
    penalised: int = 0
    parsed_ok: int = 0
    oracle_checked: int = 0
    classes: Counter = field(default_factory=Counter)
    worst_parse: Worst = field(default_factory=Worst)
    worst_play: Worst = field(default_factory=Worst)
    worst_parse_small: Worst = field(default_factory=Worst)  # texts the oracle checks (<= ORACLE_MAX_CHARS)
    worst_play_small: Worst = field(default_factory=Worst)
    worst_parse_huge: Worst = field(default_factory=Worst)  # texts above it
    worst_play_huge: Worst = field(default_factory=Worst)
    huge: list[tuple[int, float, float]] = field(default_factory=list)  # (chars, parse_turn s, Episode.play s)

    def report(self, label: str) -> str:
        return (
            f"[env fuzz {label}] {self.turns} texts over {len(self.outcomes)} episodes, {len(self.classes)} classes; "
            f"{self.oracle_checked} checked against the oracle, {self.parsed_ok} parsed, {self.penalised} penalised\n"
            f"    worst parse_turn {self.worst_parse}; worst Episode.play {self.worst_play}\n"
            f"    texts <= {ORACLE_MAX_CHARS:,} chars: worst parse_turn {self.worst_parse_small}; worst Episode.play "
            f"{self.worst_play_small}\n"
            f"    {len(self.huge)} texts > {ORACLE_MAX_CHARS:,} chars (returned, not oracle-checked): "
            "worst parse_turn "
            f"{self.worst_parse_huge}; worst Episode.play {self.worst_play_huge}"
        )


class _Recorder:
    """Wraps ``env.step`` on the instance: every call's names and result, in order."""

    def __init__(self, env: TextEnv) -> None:
        self.calls: list[tuple[tuple[str, ...], object]] = []
        self._step = env.step
        env.step = self  # type: ignore[method-assign]

    def __call__(self, actions):
        result = self._step(actions)
        self.calls.append((tuple(actions), result))
        return result


def fuzz(
    make_env: Callable[[], TextEnv], texts: Sequence[tuple[str, str]], settings: EpisodeSettings, seed0: int
) -> FuzzRun:
    """Play every text as a turn (see the module docstring for what is checked) and return the outcomes."""
    run = FuzzRun()
    s = settings
    state: dict = {}

    def close() -> None:
        ep = state["episode"]
        expected = sum(state["rewards"]) + sum(state["penalties"])
        assert math.isclose(ep.episode_return, expected, rel_tol=0, abs_tol=1e-9), (ep.episode_return, expected)
        turns = tuple((t.actions, t.valid, t.executed, t.reward, t.penalty) for t in ep.turns)
        run.outcomes.append((ep.seed, ep.episode_return, ep.success, turns))

    def open_episode() -> None:
        env = make_env()
        recorder = _Recorder(env)
        ep = Episode(env, seed0 + len(run.outcomes), s)
        state.update(episode=ep, recorder=recorder, rewards=[], penalties=[], executed=0)
        ep.first_messages()

    for cls, text in texts:
        if not state or state["episode"].done:
            if state:
                close()
            open_episode()
        ep: Episode = state["episode"]
        recorder: _Recorder = state["recorder"]
        names = ep.env.action_names
        left = s.max_actions_per_episode - state["executed"]
        assert ep.actions_left == left
        limit = min(s.max_actions_per_turn, left)

        t0 = time.perf_counter()
        parsed = parse_turn(text, limit, s.require_think)
        t_parse = time.perf_counter() - t0
        assert isinstance(parsed, ParsedTurn)
        if len(text) <= ORACLE_MAX_CHARS:
            expect = oracle_parse(text, limit, s.require_think)
            assert parsed == expect, (cls, text[:300], parsed, expect)
            run.oracle_checked += 1
        else:
            expect = parsed
        assert len(expect.actions) <= limit
        penalty, known = expected_penalty(expect.actions, names, s.format_penalty)
        if cls in MUST_PARSE:
            assert expect.format_ok and expect.actions and penalty == 0.0, (cls, text[:300], expect)
        if cls in MUST_PENALISE:
            assert penalty == s.format_penalty, (cls, text[:300], expect)

        before, n_calls, turns_before = ep.env.render(), len(recorder.calls), len(ep.turns)
        t0 = time.perf_counter()
        record = ep.play(text)
        t_play = time.perf_counter() - t0

        assert len(ep.turns) == turns_before + 1 and ep.turns[-1] is record
        assert record.actions == expect.actions, (cls, text[:300])
        assert record.penalty == penalty, (cls, text[:300], record, expect)
        assert record.valid == len(known)
        if known:
            assert len(recorder.calls) == n_calls + 1, "env.step must be called exactly once"
            called, result = recorder.calls[-1]
            assert called == tuple(known)
            assert record.reward == result.reward and record.executed == result.info["executed"]
            assert result.info["unknown"] == 0
            assert 0 <= record.executed <= len(known)
            assert ep.observation == result.observation
            state["rewards"].append(result.reward)
        else:
            assert len(recorder.calls) == n_calls, "no env.step without a known action"
            assert record.reward == 0.0 and record.executed == 0
            assert ep.env.render() == before, "the state must not change after a turn without a valid action"
        state["penalties"].append(penalty)
        state["executed"] += record.executed
        assert ep.actions_left == s.max_actions_per_episode - state["executed"]
        assert ep.done == (
            ep.env.done or state["executed"] >= s.max_actions_per_episode or len(ep.turns) >= s.max_turns
        )
        if not ep.done:
            message = ep.next_user_message()["content"]
            assert (NO_ACTION_WARNING in message) == (not known)

        run.turns += 1
        run.classes[cls] += 1
        run.penalised += penalty != 0.0
        run.parsed_ok += expect.format_ok
        run.worst_parse.update(t_parse, cls, text)
        run.worst_play.update(t_play, cls, text)
        if len(text) <= ORACLE_MAX_CHARS:
            run.worst_parse_small.update(t_parse, cls, text)
            run.worst_play_small.update(t_play, cls, text)
        else:
            run.worst_parse_huge.update(t_parse, cls, text)
            run.worst_play_huge.update(t_play, cls, text)
            run.huge.append((len(text), t_parse, t_play))
    if state:
        close()
    return run


def _corpus(n: int, seed: int, make_env: Callable[[], TextEnv]) -> list[tuple[str, str]]:
    return hostile_outputs(n, seed, action_names=make_env().action_names)


def _seed(*parts: str) -> int:
    return sum(ord(c) * 31**i for i, c in enumerate(":".join(parts))) % 10_000


# --- the generator's own contract ------------------------------------------------------------------------------


def test_hostile_outputs_contract():
    assert len(CLASSES) == len(set(CLASSES)) >= 16
    first = hostile_outputs(len(CLASSES), 3)
    assert {c for c, _ in first} == set(CLASSES)
    assert first == hostile_outputs(len(CLASSES), 3)  # deterministic
    assert hostile_outputs(200, 5)[:40] == hostile_outputs(40, 5)  # a longer corpus extends the shorter one
    assert hostile_outputs(200, 5) != hostile_outputs(200, 6)
    assert hostile_outputs(0, 1) == []
    assert all(isinstance(c, str) and isinstance(t, str) for c, t in hostile_outputs(100, 9))
    counts = Counter(schedule(2_000))
    assert set(counts) == set(CLASSES) and counts["huge_1mb"] <= 10  # the huge class stays rare
    with pytest.raises(ValueError):
        hostile_outputs(-1, 0)


# --- the oracle against hand-checked cases (so a wrong oracle cannot agree with a wrong parser) ----------------


@pytest.mark.parametrize(
    "text, require_think, actions",
    [
        ("<think>a</think><answer>Up || Left</answer>", True, ("Up", "Left")),
        ("junk <think>a</think>\n <answer> up ||  || LEFT </answer> junk", True, ("up", "LEFT")),
        ("<think>a</think> x <answer>Up</answer>", True, None),  # text between </think> and <answer>
        ("<think>a</think><|im_end|><answer>Up</answer>", True, None),  # a special token is not whitespace
        ("<think>a<think>b</think><answer>Up</answer>", True, ("Up",)),  # first <think>, first </think>
        ("<think><think>a</think></think><answer>Up</answer>", True, None),
        ("<think>a</think><answer>Up</answer><answer>Down</answer>", True, ("Up",)),
        ("<think>a</think><answer><answer>Up</answer></answer>", True, ("<answer>Up",)),
        ("<think>a</think><answer>Up |<|im_end|>| Left</answer>", True, ("Up", "Left")),  # tokens removed first
        ("<think>a</think><answer>U<|endoftext|>p</answer>", True, ("Up",)),
        ("<think>a</think><answer><| im_end |>Up</answer>", True, ("<| im_end |>Up",)),  # not a token (space)
        ("<think>a</think><answer>|||Up</answer>", True, ("|Up",)),
        ("<think>a</think><answer>Up || Down || Left</answer>", True, ("Up", "Down")),  # max_actions=2
        ("<answer>Up</answer>", True, None),
        ("<answer>Up</answer>", False, ("Up",)),
        ("prose <answer>Up</answer>", False, ("Up",)),
        ("<answer>Up</answer><think>", False, None),  # an unclosed <think> anywhere
        ("<answer>Up</answer><think>x</think>", False, None),  # the answer must follow the think block
        ("<think>a</think><ANSWER>Up</ANSWER>", True, None),  # tags are case-sensitive
        ("<think>a</think><answer>Up", True, None),
        ("", True, None),
    ],
)
def test_oracle_and_parser_on_hand_checked_cases(text, require_think, actions):
    for parse in (parse_turn, oracle_parse):
        got = parse(text, 2, require_think)
        assert (got.actions if got.format_ok else None) == actions, parse.__name__


def test_parse_turn_edge_arguments():
    for bad in (None, b"<think></think><answer>Up</answer>", 3, ["Up"]):
        assert parse_turn(bad, 2) == _NO and oracle_parse(bad, 2) == _NO
    assert (
        parse_turn("<think></think><answer>Up</answer>", 0)
        == _NO
        == oracle_parse("<think></think><answer>Up</answer>", 0)
    )


# --- parse_turn against the oracle over the corpus -------------------------------------------------------------


def test_parse_turn_matches_oracle_on_corpus():
    texts = [(c, t) for c, t in hostile_outputs(CI_TEXTS, 7) if len(t) <= ORACLE_MAX_CHARS]
    worst = Worst()
    for cls, text in texts:
        for max_actions in (1, 2, 3, 10**6):
            for require_think in (True, False):
                t0 = time.perf_counter()
                got = parse_turn(text, max_actions, require_think)
                worst.update(time.perf_counter() - t0, cls, text)
                assert got == oracle_parse(text, max_actions, require_think), (cls, text[:300], max_actions,
                                                                               require_think)
        for separator in ("|", ",", " || ", "<|im_end|>"):
            assert parse_turn(text, 10**6, separator=separator) == oracle_parse(text, 10**6, separator=separator)
    print(f"\n[parse_turn vs oracle] {len(texts)} texts x 12 argument sets; worst parse_turn {worst}")


# --- every huge shape -------------------------------------------------------------------------------------------


def test_huge_shapes_return():
    """Each huge shape through parse_turn (both modes) and one Episode turn per environment: it returns, the
    Episode rules hold (the checks of :func:`fuzz`, with parse_turn's own result as the expectation), and the
    time is printed. The oracle also runs on them here (linear, ~0.1 s/MB), without a time bound."""
    lines = []
    for variant in range(N_HUGE_VARIANTS):
        text = huge_text(variant, seed=variant)
        t0 = time.perf_counter()
        for require_think in (True, False):
            assert parse_turn(text, 2, require_think) == oracle_parse(text, 2, require_think), variant
        t_oracle = time.perf_counter() - t0
        times = []
        for name, make_env in ENVS.items():
            t0 = time.perf_counter()
            run = fuzz(make_env, [("huge_1mb", text)], SETTINGS["default"], seed0=variant)
            times.append(f"{name} {(time.perf_counter() - t0) * 1e3:.1f}")
            assert run.turns == 1
        t0 = time.perf_counter()
        parse_turn(text, 2)
        t_parse = time.perf_counter() - t0
        lines.append(f"variant {variant:2d} ({len(text):>9,} chars): parse_turn {t_parse * 1e3:6.1f} ms; "
                     f"oracle x2 {t_oracle * 1e3:7.1f} ms; one turn incl. the checks (ms): {', '.join(times)}")
    print("\n[huge shapes]\n  " + "\n  ".join(lines))


# --- the environment fuzz --------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings_name", sorted(SETTINGS))
@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_env_fuzz(env_name, settings_name):
    make_env, settings = ENVS[env_name], SETTINGS[settings_name]
    seed = _seed(env_name, settings_name)
    texts = _corpus(CI_TEXTS, seed, make_env)
    run = fuzz(make_env, texts, settings, seed0=seed)
    assert run.turns == CI_TEXTS and set(run.classes) == set(CLASSES)
    assert 0 < run.penalised < run.turns and run.parsed_ok > 0
    again = fuzz(make_env, texts, settings, seed0=seed)
    assert again.outcomes == run.outcomes, "same texts and seeds must give the same episodes"
    print("\n" + run.report(f"{env_name}/{settings_name}"))


@pytest.mark.slow
@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_env_fuzz_slow(env_name):
    make_env = ENVS[env_name]
    for settings_name, settings in SETTINGS.items():
        seed = _seed("slow", env_name, settings_name)
        texts = _corpus(SLOW_TEXTS, seed, make_env)
        t0 = time.perf_counter()
        run = fuzz(make_env, texts, settings, seed0=seed)
        elapsed = time.perf_counter() - t0
        assert run.turns == SLOW_TEXTS and set(run.classes) == set(CLASSES)
        again = fuzz(make_env, texts, settings, seed0=seed)
        assert again.outcomes == run.outcomes
        print(f"\n{run.report(f'slow {env_name}/{settings_name}')}\n    one pass {elapsed:.1f} s")
