"""Whether an answer would make the verifier's parser build an enormous number: :func:`too_big`.

Math-Verify turns LaTeX into SymPy with evaluation on, so numeric powers, factorials, binomials and products are
computed exactly while parsing. An answer such as ``9^{9^{9^{9}}}``, ``100000000!``, ``\\binom{10^8}{5}``,
``\\prod_{k=1}^{10^6} k`` or a bare chain ``2^2^2^...`` is short, shallow and bracket-light, so the character and
bracket bounds pass it, and it then holds a worker for its whole time limit (measured on a 2-core box, 2 s limit:
each of those took the limit; 8 of them held the batch to its deadline). This estimate reads the answer once and
follows each numeric sub-expression's size in log10 (an upper bound; a symbol makes a value unknown, which stops
nothing): an answer is too big when any integer it builds would have more than :data:`MAX_DIGITS` digits, or a
factorial, binomial top or product/sum bound exceeds :data:`MAX_TERMS`. Measured on the same box, one item each:
``2^{10^7}`` (3 million digits) 0.07 s, ``10^{10^6}`` 0.18 s, ``100000!`` 0.10 s, ``\\binom{100000}{50000}`` 0.78 s,
``9^{9^{9}}`` (370 million digits) and ``(10^6)!`` over 2 s. Real answers stay far below: ``2^{2^{2^{2}}}`` is
65536. No library estimates this (SymPy's own ``evaluate=False`` would change how Math-Verify compares), hence
this small recursive reader; it never raises, and an answer it cannot follow is left to the worker's time limit.
"""

from __future__ import annotations

import math
import re

MAX_DIGITS = 1e7  # an integer with more digits than this is an attack, not an answer
MAX_TERMS = 1e5  # factorial argument, binomial top, product or sum bound

_TOKEN = re.compile(r"\\[A-Za-z]+|[0-9]+(?:\.[0-9]*)?|\S")  # ASCII digits: float() refuses "₀", "❻"
_FRACS = {"\\frac", "\\dfrac", "\\tfrac"}
_BINOMS = {"\\binom", "\\dbinom", "\\tbinom"}
_BIG_OPERATORS = {"\\prod", "\\sum"}
_TIMES = {"*", "\\cdot", "\\times", "/", "\\div"}
_DECORATIONS = {"\\left", "\\right", "\\big", "\\Big", "\\bigg", "\\Bigg", "\\displaystyle", "\\,", "\\!", "\\;"}
_SIGNS = {"-", "+", "\\pm", "\\mp"}
_OPENERS = {"{", "(", "["}
_CLOSERS = {"}", ")", "]"}


class _TooBig(Exception):
    pass


def too_big(answer: str) -> bool:
    """Whether ``answer`` (LaTeX) builds an integer of more than :data:`MAX_DIGITS` digits or a factorial, binomial
    or product over more than :data:`MAX_TERMS` terms while it is parsed (module docstring)."""
    reader = _Reader(_TOKEN.findall(answer))
    try:
        while reader.i < len(reader.tokens):
            start = reader.i
            reader.expression()
            if reader.i == start:  # a token no rule starts with (a stray closer): step over it
                reader.i += 1
    except _TooBig:
        return True
    except RecursionError:  # hundreds of chained powers or prefixes: no answer looks like that
        return True
    except (ArithmeticError, ValueError):  # a size this reader cannot follow: left to the worker's time limit
        return False
    return False


def _checked_power(base: float | None, exponent: float | None) -> float | None:
    """log10 of base^exponent from their log10s. A symbol's power stays symbolic (unknown, nothing built); a number's
    is built, whatever the exponent's sign (2^{-10^8} builds 2^{10^8} too)."""
    if base is None or exponent is None:
        return None
    if base <= 0:  # 1 (or a fraction) to any power: nothing grows
        return 0.0
    if exponent > 300 or 10 ** exponent * base > MAX_DIGITS:
        raise _TooBig
    return 10 ** exponent * base


def _checked_terms(n: float | None) -> None:
    if n is not None and n > math.log10(MAX_TERMS):
        raise _TooBig


class _Reader:
    """Recursive descent over the tokens: expression = product (separator product)*; product = power (times
    power)*; power = postfix (^ power)?; postfix = atom !*. Each returns log10 of the magnitude, or None."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def expression(self) -> float | None:
        value = self.product()
        while (tok := self.peek()) is not None and tok not in _CLOSERS:
            self.i += 1  # a separator (+, -, =, comma, relation, ...): the larger side bounds the value
            other = self.product()
            value = None if value is None or other is None else max(value, other) + 0.302
        return value

    def product(self) -> float | None:
        value = self.power()
        while (tok := self.peek()) is not None:
            if tok in _TIMES:
                self.i += 1
            elif not self.starts_atom(tok):
                break
            other = self.power()
            value = None if value is None or other is None else value + max(other, 0.0)
        return value

    def power(self) -> float | None:
        base = self.postfix()
        if self.peek() == "^":
            self.i += 1
            return _checked_power(base, self.power())  # right-associative: 2^2^2 is 2^(2^2)
        return base

    def postfix(self) -> float | None:
        value = self.atom()
        while self.peek() == "!":
            self.i += 1
            if value is not None:
                _checked_terms(value)
                n = 10 ** value
                value = n * math.log10(max(n, 2.0))  # log10(n!) <= n log10 n
        return value

    def starts_atom(self, tok: str) -> bool:
        return tok in _OPENERS or tok[0].isalnum() or (tok.startswith("\\") and tok not in _TIMES)

    def group(self) -> float | None:
        """A bracketed group, the opener already read."""
        value = self.expression()
        if self.peek() in _CLOSERS:
            self.i += 1
        return value

    def atom(self) -> float | None:
        tok = self.peek()
        if tok is None or tok in _CLOSERS:
            return None
        self.i += 1
        if tok[0] in "0123456789":
            number = float(tok)
            return math.log10(number) if number > 0 else 0.0
        if tok in _OPENERS:
            return self.group()
        if tok in _DECORATIONS:
            return self.atom()
        if tok in _SIGNS:  # unary: -10^8 is -(10^8)
            return self.power()
        if tok in _FRACS:
            numerator, _ = self.atom(), self.atom()
            return numerator
        if tok in _BINOMS:
            top, _ = self.atom(), self.atom()
            _checked_terms(top)
            return None if top is None else 10 ** top * 0.302  # C(n, k) <= 2^n
        if tok in _BIG_OPERATORS:
            while self.peek() in ("_", "^"):  # both bounds, either order
                self.i += 1
                _checked_terms(self.atom())
            return None
        if tok == "\\sqrt":
            if self.peek() == "[":
                self.i += 1
                self.group()
            value = self.atom()
            return None if value is None else value / 2
        if tok == "_":  # a subscript names a symbol
            self.atom()
            return None
        return None  # a letter, a command such as \pi, or punctuation: a symbol as far as size goes
