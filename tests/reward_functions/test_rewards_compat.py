"""``rewards/math.py`` became ``rewards/math_rewards.py`` (the old name shadows the stdlib's ``math`` for scripts run
from rewards/): the old import paths still reach the same module object, so wrapping one wraps the other."""

from __future__ import annotations

import importlib
import math as stdlib_math
import sys
from pathlib import Path

import rewards


def test_old_module_path_is_the_renamed_module():
    old = importlib.import_module("rewards.math")
    new = importlib.import_module("rewards.math_rewards")
    assert old is new and rewards.math is new
    from rewards.math import extract_final_answer  # the spelling trainer/eval/grading.py uses

    assert extract_final_answer is new.extract_final_answer
    assert stdlib_math.sqrt(4.0) == 2.0 and not hasattr(new, "sqrt")


def test_no_module_file_named_like_a_stdlib_module():
    names = {p.stem for p in Path(rewards.__path__[0]).glob("*.py")}
    assert not names & set(sys.stdlib_module_names)
