"""Seeded generator of hostile model completions, for fuzzing parsers, environments and reward functions.

Nothing is stored on disk: ``hostile_outputs(n, seed)`` rebuilds the same list of ``(class_name, text)`` pairs
for the same ``(n, seed)`` (and ``action_names``) in every process -- each text comes from its own
``random.Random`` seeded with a string (hashed with SHA-512 by ``random``, so ``PYTHONHASHSEED`` does not
matter), and a longer corpus starts with the shorter one (``hostile_outputs(n, s) == hostile_outputs(m, s)[:n]``
for n <= m).

Texts are dealt round-robin over :data:`CLASSES`, so every class appears at least once when
``n >= len(CLASSES)``. The expensive class ``huge_1mb`` only takes part in every ``huge_every``-th round (the
first round included), which keeps a 2,000-text corpus at ~5 huge texts and a 10,000-text one at ~24.

Classes (``action_names`` are the valid move names, default Up/Down/Left/Right):

- empty: the empty string.
- whitespace_only: only characters for which ``str.isspace()`` holds (ASCII, NBSP, em space, U+2028/9, U+001C..1F,
  U+0085, ...).
- random_unicode: astral code points, stacked combining marks (zalgo), RTL scripts and bidi controls, C0/C1 control
  characters, NUL runs, BOM/zero-width/non-characters, CJK, random BMP; sometimes with tags or move names mixed in or
  wrapped in a well-formed answer. Never lone surrogates (a decoded completion cannot contain one).
- invalid_utf8: random bytes, or the UTF-8 of an answer with invalid sequences injected (overlong, truncated, encoded
  surrogates, > U+10FFFF, stray continuation bytes), decoded with ``errors="replace"``.
- huge_1mb: ~1-7 MB texts (one of :data:`N_HUGE_VARIANTS` shapes, see :func:`huge_text`): ``<think>`` or ``||``
  repeated a million times, 1 MB reasoning, 150k actions, unclosed answers, ``<|`` floods, 1 MB of digits or nested
  ``\\boxed{``.
- unclosed_tags: the four tags (``<think>``, ``</think>``, ``<answer>``, ``</answer>``) each present 0, 1 or 2 times
  (all 81 combinations, cycled), in random order, sometimes in case variants (``<ANSWER>``, ``</Think>``), with names /
  separators / prose between them.
- nested_tags: think and answer blocks inside each other, duplicated, deeply nested (up to hundreds of levels), tags
  quoted inside the reasoning.
- many_actions: a well-formed answer with 100-3,000 actions separated by ``||`` (odd spacing, ``|||``), a mix of valid
  names in any case, unknown names and empty parts.
- unknown_actions: a well-formed answer whose every action is unknown (typos, other games' moves, homoglyphs, fullwidth
  letters, zero-width characters, punctuation, several names in one part); never valid after ``strip().lower()``.
- valid_mixed_case: a well-formed answer whose every action is a valid name in random letter case with odd
  (``str.isspace``) whitespace around it and around the separators, empty parts, and arbitrary text before ``<think>``
  / after ``</answer>``: must parse, with no unknown action.
- special_tokens: chat special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ...) and look-alikes
  (over-long, containing whitespace or ``|``, unclosed) inserted at random places of a well-formed answer -- inside
  names, tags, separators and the think/answer gap.
- huge_numbers: ``1e999999``, ``10^10^10^10``, ``9**9**9**9``, ``2^(2^(2^(2^100)))``, ``100000!``, digit strings of
  4,301-100,000 digits, ... as answers, in ``\\boxed{}`` or in prose.
- boxed_unbalanced: ``\\boxed{`` nested up to 1,000 deep (closed or not), unbalanced braces, ``\\boxed{}`` empty,
  several boxes, ``\\boxed`` without braces, ``\\fbox``.
- latex_sympy_hostile: ``\\frac{}{}``, ``\\sqrt[]{...}``, ``\\left(`` without ``\\right``, ``\\int``, ``\\matrix``,
  unclosed ``\\begin{pmatrix}``, ``%``, ``\\\\``, ``\\frac`` nested up to 300 deep, unknown macros, stray ``$``.
- separators_only: ``||||``, `` || || ``, runs of ``|`` with whitespace, bare or as the whole answer of a well-formed
  turn.
- tag_lookalikes: a well-formed answer with one or more tags replaced by a look-alike (``< think>``, ``<thinking>``,
  ``<answer/>``, ``</ answer>``, fullwidth brackets, ``&lt;answer&gt;``, a Cyrillic letter or a zero-width space inside
  the tag name).
- well_formed: ``<think>reasoning</think><answer>A || B</answer>`` with 1-3 valid names in canonical case.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable, Sequence

DEFAULT_ACTION_NAMES: tuple[str, ...] = ("Up", "Down", "Left", "Right")
HUGE_EVERY = 25  # huge_1mb takes part in rounds 0, HUGE_EVERY, 2 * HUGE_EVERY, ...

CLASSES: tuple[str, ...] = (
    "empty",
    "whitespace_only",
    "random_unicode",
    "invalid_utf8",
    "huge_1mb",
    "unclosed_tags",
    "nested_tags",
    "many_actions",
    "unknown_actions",
    "valid_mixed_case",
    "special_tokens",
    "huge_numbers",
    "boxed_unbalanced",
    "latex_sympy_hostile",
    "separators_only",
    "tag_lookalikes",
    "well_formed",
)

# --- building blocks -------------------------------------------------------------------------------------

# characters with str.isspace() true (str.strip() removes them)
_SPACES = (" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u00a0", "\u1680",
           "\u2000", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000")
_THOUGHTS = (
    "The box is left of the target, so I push it right.",
    "I should avoid the hole.",
    "Let me think step by step. 2 + 2 = 4.",
    "Going up then left reaches the goal",
    "",
    "   ",
    "hmm\n\nwait, actually <no>",
    "I'll answer with Up || Left",
    "\u05e9\u05dc\u05d5\u05dd \u202e reversed \u202c",
)
_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "<|im_start|>user\n",
                   "<|fim_prefix|>", "<|vision_start|>", "<|box_start|>", "<|endoftext|><|endoftext|>")
_SPECIAL_LOOKALIKES = ("<|im_end|", "|im_end|>", "<| im_end |>", "<|im end|>", "<||>", "<|a|b|>",
                       "<|" + "x" * 41 + "|>",
                       "<|" + "x" * 40 + "|>", "<|<|im_end|>|>", "< |im_end| >", "<|\u00a0|>")
_UNKNOWN_NAMES = (
    "Jump", "North", "South", "East", "West", "Stay", "Wait", "Push", "Pull", "Noop", "Upward", "Downward",
    "Leftt", "Rigth", "Lfet", "Up2", "U p", "L eft", "Up.", "'Up'", '"Left"', "<Up>", "[Down]", "Up!", "up()",
    "move up", "UP_", "None", "null", "undefined", "1", "0", "-1", "\uff35\uff50", "\uff2c\uff45\uff46\uff54",
    "Up\u200b", "\u200bLeft", "Lef\u0074\u0301", "R\u0456ght", "D\u043ewn", "Up Left", "Up,Left", "Up|Left",
    "\x00Up", "Down\x00", "Up\ufeff", "\u202eUp", "Right\u0300", "\U0001f446", "\u2191", "\u2190", "\u21e8",
    "Up</answer", "Up<", "a" * 200, "\u0130", "Ri\u0307ght",
)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_TAG_CASES = {
    "<think>": ("<THINK>", "<Think>", "<tHiNk>"),
    "</think>": ("</THINK>", "</Think>", "</thinK>"),
    "<answer>": ("<ANSWER>", "<Answer>", "<aNsWeR>"),
    "</answer>": ("</ANSWER>", "</Answer>", "</answeR>"),
}
_TAG_LOOKALIKES = {
    "<think>": ("< think>", "<think >", "<thinking>", "<think/>", "<\u200bthink>", "\uff1cthink\uff1e",
                "&lt;think&gt;",
                "<th\u0456nk>", "[think]", "<th\u0131nk>", "<thin k>"),
    "</think>": ("</ think>", "</think >", "</thinking>", "<\\think>", "</th\u0456nk>", "<think/>", "<//think>",
                 "\uff1c/think\uff1e", "&lt;/think&gt;", "</think"),
    "<answer>": ("< answer>", "<answer >", "<answers>", "<answer/>", "<\u0430nswer>", "\uff1canswer\uff1e",
                 "&lt;answer&gt;", "<ans\u200bwer>", "**Answer:**", "<answer", "answer>"),
    "</answer>": ("</ answer>", "</answer >", "<\\answer>", "</answers>", "<answer/>", "</\u0430nswer>",
                  "&lt;/answer&gt;",
                  "\uff1c/answer\uff1e", "</answer", "<//answer>"),
}


def _ws(rng: random.Random, lo: int = 0, hi: int = 3) -> str:
    return "".join(rng.choice(_SPACES) for _ in range(rng.randint(lo, hi)))


def _thought(rng: random.Random) -> str:
    return rng.choice(_THOUGHTS)


def _answer(rng: random.Random, answer: str, thinking: str | None = None) -> str:
    """A well-formed turn around ``answer`` (only whitespace between </think> and <answer>)."""
    thinking = _thought(rng) if thinking is None else thinking
    gap = rng.choice(("", " ", "\n", "\n\n", _ws(rng, 1, 4)))
    return f"<think>{thinking}</think>{gap}<answer>{answer}</answer>"


def _maybe_wrap(rng: random.Random, payload: str, names: Sequence[str]) -> str:
    """The payload bare, as the answer, as the reasoning, around the tags or inside a name."""
    mode = rng.randrange(7)
    if mode == 0:
        return payload
    if mode == 1:
        return _answer(rng, payload)
    if mode == 2:
        return _answer(rng, rng.choice(names), thinking=payload)
    if mode == 3:
        return payload + _answer(rng, rng.choice(names))
    if mode == 4:
        return _answer(rng, rng.choice(names)) + payload
    if mode == 5:
        return _answer(rng, f"{rng.choice(names)} || {payload}")
    return f"The answer is {payload}."


def _random_case(rng: random.Random, name: str) -> str:
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)


def _astral(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return chr(rng.randint(0x1F300, 0x1FAFF))  # emoji blocks
    return chr(rng.randint(0x10000, 0x10FFFF))


def _bmp(rng: random.Random) -> str:
    cp = rng.randint(0, 0xFFFF - 0x800)
    return chr(cp if cp < 0xD800 else cp + 0x800)  # skip the surrogate range


def _unicode_segment(rng: random.Random, names: Sequence[str]) -> str:
    kind = rng.randrange(11)
    k = rng.randint(1, 40)
    if kind == 0:
        return "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(k))
    if kind == 1:
        return "".join(_astral(rng) for _ in range(k))
    if kind == 2:  # zalgo
        return "".join(rng.choice("aUpL") + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 60)))
                       for _ in range(rng.randint(1, 5)))
    if kind == 3:  # RTL scripts and bidi controls
        pool = [chr(c) for c in range(0x5D0, 0x5EB)] + [chr(c) for c in range(0x627, 0x64B)]
        pool += ["\u202e", "\u202b", "\u200f", "\u2067", "\u2069", "\u202c", "\u061c"]
        return "".join(rng.choice(pool) for _ in range(k))
    if kind == 4:  # C0 / C1 controls
        return "".join(chr(rng.choice((rng.randint(0, 0x1F), 0x7F, rng.randint(0x80, 0x9F)))) for _ in range(k))
    if kind == 5:
        return "\x00" * k
    if kind == 6:
        return "".join(rng.choice(("\ufeff", "\u200b", "\u200c", "\u200d", "\u2060", "\ufffd", "\uffff", "\ufffe",
                                   "\U0010ffff", "\u2028", "\u2029", "\x85", "\u00ad")) for _ in range(k))
    if kind == 7:
        return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(k))
    if kind == 8:
        return "".join(_bmp(rng) for _ in range(k))
    if kind == 9:
        return rng.choice(_TAGS + ("||", "|") + tuple(names))
    return _ws(rng, 1, 5)


# --- the classes -----------------------------------------------------------------------------------------

Gen = Callable[[random.Random, int, Sequence[str]], str]


def _empty(rng: random.Random, k: int, names: Sequence[str]) -> str:
    return ""


def _whitespace_only(rng: random.Random, k: int, names: Sequence[str]) -> str:
    n = rng.choice((1, 2, 5, 20, 200, 2000))
    return "".join(rng.choice(_SPACES) for _ in range(n))


def _random_unicode(rng: random.Random, k: int, names: Sequence[str]) -> str:
    text = "".join(_unicode_segment(rng, names) for _ in range(rng.randint(1, 30)))
    return _maybe_wrap(rng, text, names) if rng.random() < 0.4 else text


_BAD_UTF8 = (b"\xff", b"\xfe", b"\xc0\xaf", b"\xc0\xbc", b"\xe0\x80\xbc", b"\xed\xa0\x80", b"\xed\xbf\xbf",
             b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80", b"\xbf\xbf", b"\xc3")


def _invalid_utf8(rng: random.Random, k: int, names: Sequence[str]) -> str:
    if rng.random() < 0.4:
        raw = rng.randbytes(rng.choice((1, 7, 64, 512, 4096)))
    else:
        good = _answer(rng, " || ".join(rng.choice(names) for _ in range(rng.randint(1, 3)))).encode("utf-8")
        raw = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            at = rng.randint(0, len(raw))
            raw[at:at] = rng.choice(_BAD_UTF8)
        raw = bytes(raw)
    return raw.decode("utf-8", errors="replace")


N_HUGE_VARIANTS = 12


def huge_text(variant: int, seed: int = 0, action_names: Sequence[str] = DEFAULT_ACTION_NAMES) -> str:
    """One of the :data:`N_HUGE_VARIANTS` huge shapes (``variant`` taken modulo that number)."""
    rng = random.Random(f"huge:{seed}:{variant}")
    names = tuple(action_names)
    variant %= N_HUGE_VARIANTS
    mb = 1_000_000
    if variant == 0:  # 7 MB: "<think>" a million times (unclosed reasoning)
        return "<think>" * mb
    if variant == 1:  # 2 MB of separators as the answer of a well-formed turn
        return "<think>t</think><answer>" + "||" * mb + "</answer>"
    if variant == 2:  # 1 MB of reasoning with tags in it, then a valid answer
        chunk = "".join(_unicode_segment(rng, names) for _ in range(60)).replace("</think>", "")
        chunk = (chunk or "x") * (mb // max(1, len(chunk)) + 1)
        return "<think>" + chunk[:mb] + "</think>\n<answer>" + f"{names[0]} || {names[-1]}" + "</answer>"
    if variant == 3:  # ~150k actions, valid and unknown
        pool = list(names) + [n.upper() for n in names] + ["Jump", "X", ""]
        body = " || ".join(rng.choice(pool) for _ in range(256))
        return "<think>many</think><answer>" + (body + " || ") * (mb // len(body)) + "</answer>"
    if variant == 4:  # a random 4 KB unicode chunk with tags inside, repeated to 1 MB
        chunk = "".join(_unicode_segment(rng, names) for _ in range(200))
        return (chunk or "x") * (mb // max(1, len(chunk)) + 1)
    if variant == 5:  # an answer opened 125k times, never closed
        return "<think>x</think>" + "<answer>" * (mb // 8)
    if variant == 6:  # "||" a million times, bare
        return "||" * mb
    if variant == 7:  # special-token scanner stress: "<|" half a million times inside the answer
        return "<think>t</think><answer>" + "<|" * (mb // 2) + f"{names[0]}</answer>"
    if variant == 8:  # \boxed{ nested 140k deep inside the answer
        d = 140_000
        return "<think>t</think><answer>" + "\\boxed{" * d + "1" + "}" * d + "</answer>"
    if variant == 9:  # a million digits
        return "<think>t</think><answer>\\boxed{" + "9" * mb + "}</answer>"
    if variant == 10:  # 1 MB of reasoning that never closes
        return "<think>" + "a" * mb
    # 1 MB of whitespace between </think> and <answer> (still a valid turn)
    return "<think>t</think>" + " \n\t" * (mb // 3) + f"<answer>{names[-1]}</answer>"


def _huge_1mb(rng: random.Random, k: int, names: Sequence[str]) -> str:
    return huge_text(rng.randrange(N_HUGE_VARIANTS), rng.getrandbits(32), names)


_TAG_COUNTS = tuple(itertools.product(range(3), repeat=4))  # 81 presence/duplication combinations


def _filler(rng: random.Random, names: Sequence[str]) -> str:
    return rng.choice(("", " ", "\n", _thought(rng), rng.choice(names), f"{rng.choice(names)} || {rng.choice(names)}",
                       "||", "Jump", _ws(rng, 1, 3)))


def _unclosed_tags(rng: random.Random, k: int, names: Sequence[str]) -> str:
    counts = _TAG_COUNTS[k % len(_TAG_COUNTS)]
    tags = [tag for tag, c in zip(_TAGS, counts) for _ in range(c)]
    rng.shuffle(tags)
    if rng.random() < 0.3:
        tags = [rng.choice(_TAG_CASES[t]) if rng.random() < 0.5 else t for t in tags]
    parts = [_filler(rng, names)]
    for tag in tags:
        parts += [tag, _filler(rng, names)]
    return "".join(parts)


_NESTED_FIXED = (
    "<think><think>a</think></think><answer>{a}</answer>",
    "<think>a</think><answer><answer>{a}</answer></answer>",
    "<think><answer>{b}</answer></think><answer>{a}</answer>",
    "<think><answer>{b}</answer></think>\n<answer>{a}</answer>",
    "<answer><think>x</think>{a}</answer>",
    "<think>a<think>b</think>c</think><answer>{a}</answer>",
    "<think>a</think><think>b</think><answer>{a}</answer>",
    "<think>x</think><answer>{a}<think>y</think>||{b}</answer>",
    "<think>x</think><answer>{a}</answer><answer>{b}</answer>",
    "<think>I will write <answer>{b}</answer> later</think><answer>{a}</answer>",
    "<think>x</think><answer>{a} || <answer>{b}</answer>",
    "<think>x</think><answer><think>{a}</think></answer>",
    "<answer>{a}</answer><think>x</think>",
    "<answer>{a}</answer><think>x</think><answer>{b}</answer>",
    "<answer>{a}</answer> <think>",
)


def _nested_tags(rng: random.Random, k: int, names: Sequence[str]) -> str:
    a, b = rng.choice(names), rng.choice(names)
    if k < len(_NESTED_FIXED) or rng.random() < 0.3:
        return _NESTED_FIXED[k % len(_NESTED_FIXED)].format(a=a, b=b)
    if rng.random() < 0.3:  # deep symmetric nesting
        d = rng.choice((2, 10, 100, 500))
        inner = rng.choice(("x", a, f"<answer>{a}</answer>"))
        tag = rng.choice(("think", "answer"))
        body = f"<{tag}>" * d + inner + f"</{tag}>" * d
        return body + (f"<answer>{b}</answer>" if tag == "think" else "")

    def node(depth: int) -> str:
        if depth > 6 or rng.random() < 0.3:
            return rng.choice((a, b, "x", " || ", _thought(rng), ""))
        tag = rng.choice(("think", "answer"))
        return f"<{tag}>" + "".join(node(depth + 1) for _ in range(rng.randint(1, 3))) + f"</{tag}>"

    return "".join(node(0) for _ in range(rng.randint(1, 4)))


def _many_actions(rng: random.Random, k: int, names: Sequence[str]) -> str:
    count = rng.choice((100, 101, 150, 500, 1000, 3000))
    pool = list(names) + [_random_case(rng, n) for n in names] + ["Jump", "UP!", "", " ", "\u00a0"]
    acts = [rng.choice(pool) for _ in range(count)]
    mode = k % 3
    if mode == 1:  # the first ones valid, unknown ones later (the truncation decides the penalty)
        acts[:2] = [rng.choice(names), rng.choice(names)]
    elif mode == 2:  # unknown first
        acts[0] = "Jump"
    out = []
    for i, act in enumerate(acts):
        if i:
            out.append(rng.choice(("||", " || ", "||", " ||", "|| ", "\n||\n", "|||", " || || ")))
        out.append(act)
    return _answer(rng, "".join(out))


def _unknowns(names: Sequence[str]) -> tuple[str, ...]:
    lowered = {n.lower() for n in names}
    return tuple(u for u in _UNKNOWN_NAMES if u.strip().lower() not in lowered and "||" not in u)


def _unknown_actions(rng: random.Random, k: int, names: Sequence[str]) -> str:
    pool = _unknowns(names)
    acts = [rng.choice(pool) for _ in range(rng.randint(1, 5))]
    return _answer(rng, " || ".join(acts))


def _valid_mixed_case(rng: random.Random, k: int, names: Sequence[str]) -> str:
    parts = [_ws(rng, 0, 3) + _random_case(rng, rng.choice(names)) + _ws(rng, 0, 3) for _ in range(rng.randint(1, 4))]
    sep = lambda: rng.choice(("||", " || ", "\t||\n", "\u00a0||\u3000", "|| ||", " ||  || "))  # noqa: E731
    answer = sep() if rng.random() < 0.2 else ""
    answer += sep().join(parts) + (sep() if rng.random() < 0.2 else "")
    prefix = rng.choice(("", "", "Sure! ", "\u00a0\n", "Answer: ||", "</answer> stray "))
    suffix = rng.choice(("", "", " Done.", "\n<answer>Jump</answer>", "</think>", "\x00"))
    thinking = rng.choice((_thought(rng), "", _random_case(rng, "<ANSWER>")))
    gap = _ws(rng, 0, 4)
    return f"{prefix}<think>{thinking}</think>{gap}<answer>{answer}</answer>{suffix}"


def _special_tokens(rng: random.Random, k: int, names: Sequence[str]) -> str:
    base = _answer(rng, " || ".join(rng.choice(names) for _ in range(rng.randint(1, 3))))
    if rng.random() < 0.1:
        return "".join(rng.choice(_SPECIAL_TOKENS + _SPECIAL_LOOKALIKES) for _ in range(rng.randint(1, 50)))
    if rng.random() < 0.15:  # tokens that join two pipes into a separator: "Up |<|im_end|>| Left"
        a, b = rng.choice(names), rng.choice(names)
        return _answer(rng, f"{a} |{rng.choice(_SPECIAL_TOKENS)}| {b}")
    text = base
    for _ in range(rng.randint(1, 6)):
        token = rng.choice(_SPECIAL_TOKENS) if rng.random() < 0.7 else rng.choice(_SPECIAL_LOOKALIKES)
        at = rng.randint(0, len(text))
        text = text[:at] + token + text[at:]
    return text


_HUGE_NUMBERS = (
    "1e999999", "1e-999999", "-1e999999", "1E+999999999", "10^10^10^10", "9**9**9**9", "2^(2^(2^(2^100)))",
    "10^{10^{10^{10}}}", "9^{9^{9^{9}}}", "2**1000000", "10**10**10", "100000!", "(10^{100})!", "factorial(100000)",
    "\\infty", "-\\infty", "inf", "nan", "NaN", "-0", "1.7976931348623157e309", "0.1e-400", "1/0", "0/0",
    "10^(-10^10)", "2^{2^{2^{2^{2}}}}", "\\frac{1}{10^{10^{10}}}", "e^{e^{e^{100}}}", "\\underbrace{9^{9^{\\cdots}}}",
)


def _huge_numbers(rng: random.Random, k: int, names: Sequence[str]) -> str:
    if k % 3 == 2:
        digits = rng.choice((4301, 5000, 20_000, 100_000))
        lead = str(rng.randint(1, 9))
        number = lead + "".join(rng.choice("0123456789") for _ in range(min(digits, 300))) * (digits // 300 + 1)
        number = number[:digits]
        if rng.random() < 0.3:
            number = rng.choice(("-", "0.", "1/", "0x", "")) + number
    else:
        number = rng.choice(_HUGE_NUMBERS)
    form = rng.randrange(4)
    if form == 0:
        number = f"\\boxed{{{number}}}"
    elif form == 1:
        number = f"${number}$"
    return _maybe_wrap(rng, number, names) if rng.random() < 0.6 else _answer(rng, number)


def _boxed_unbalanced(rng: random.Random, k: int, names: Sequence[str]) -> str:
    d = rng.choice((2, 10, 100, 1000))
    shapes = (
        "\\boxed{" * d + "1" + "}" * d,
        "\\boxed{" * d + "1",
        "\\boxed{}",
        "\\boxed{}" * rng.randint(2, 50),
        "\\boxed{1}\\boxed{2}",
        "\\boxed{1} and \\boxed{2} and \\boxed{}",
        "\\boxed{{1}",
        "\\boxed{1}}",
        "}\\boxed{",
        "\\boxed",
        "\\boxed{",
        "\\boxed 5",
        "\\boxed{\\boxed{}}",
        "\\fbox{2}",
        "\\boxed{" + "{" * d + "2",
        "\\boxed{1" + "}" * d,
        "$\\boxed{\\frac{1}{2}$",
        "\\boxed{\\text{" * d,
        "".join(rng.choice(("{", "}", "\\boxed{", "1", " ")) for _ in range(d)),
    )
    payload = shapes[k % len(shapes)] if k < len(shapes) else rng.choice(shapes)
    return _maybe_wrap(rng, payload, names) if rng.random() < 0.6 else _answer(rng, payload)


_LATEX = (
    "\\frac{}{}", "\\frac{1}{0}", "\\frac{1}{}", "\\frac", "\\frac12", "\\dfrac{a}{", "\\sqrt[]{2}", "\\sqrt[3]{}",
    "\\sqrt{", "\\sqrt[", "\\left( x", "x \\right)", "\\left\\{ \\right.", "\\left[ 1, 2", "\\int_0^\\infty e^{-x} dx",
    "\\int", "\\iint\\oint", "\\matrix{1 & 2 \\\\ 3 & 4}", "\\begin{pmatrix} 1 & 2", "\\begin{pmatrix}\\end{bmatrix}",
    "\\begin{cases} x & y", "50\\%", "%", "100%", "\\\\", "\\\\\\\\", "\\sum_{n=1}^{\\infty}", "\\lim_{x\\to 0}",
    "\\text{", "\\mathrm{}", "\\operatorname{}", "$$$$", "$", "\\(", "\\[", "\\]", "\\begin{align}",
    "\\undefinedmacro{1}",
    "1 = 2 = 3", "x = ", "= =", "\\pm\\mp", "\\emptyset", "\\{\\}", "a \\over b", "\\binom{}{}", "^^", "_{}", "x^",
    "\\cdot\\cdot", "\\,\\;\\!", "{}", "\\", "\\frac{\\sqrt{}}{\\left(}", "\\mathbb{R}^{", "\\log_{}", "\\sin^{-1}(",
    "#", "&&", "\\newcommand{\\x}{\\x}\\x", "\\def\\a{\\a}\\a", "\\overline{", "1,000,000", "3.14.15", "\\approx",
)


def _latex_sympy_hostile(rng: random.Random, k: int, names: Sequence[str]) -> str:
    if k % 4 == 3:
        d = rng.choice((5, 50, 300))
        payload = rng.choice(("\\frac{" * d + "1" + "}{2}" * d, "x^{" * d + "2" + "}" * d,
                              "\\sqrt{" * d + "2" + "}" * d,
                              "\\frac{1}{" * d + "1" + "}" * d, "(" * d + "1" + ")" * d, "\\left(" * d + "1"))
    else:
        payload = " ".join(rng.choice(_LATEX) for _ in range(rng.randint(1, 4)))
    return _maybe_wrap(rng, payload, names) if rng.random() < 0.6 else _answer(rng, payload)


def _separators_only(rng: random.Random, k: int, names: Sequence[str]) -> str:
    shapes = ("||||", " || || ", "||", "|", "|" * rng.randint(1, 500),
              "".join(rng.choice(("||", "|", " ", "\n", "\u00a0")) for _ in range(rng.randint(1, 200))))
    payload = shapes[k % len(shapes)]
    return _answer(rng, payload) if rng.random() < 0.6 else payload


def _tag_lookalikes(rng: random.Random, k: int, names: Sequence[str]) -> str:
    tags = list(_TAGS)
    replace = rng.sample(range(4), rng.randint(1, 4))
    for i in replace:
        tags[i] = rng.choice(_TAG_LOOKALIKES[_TAGS[i]])
    answer = " || ".join(rng.choice(names) for _ in range(rng.randint(1, 3)))
    return f"{tags[0]}{_thought(rng)}{tags[1]}{rng.choice(('', ' ', chr(10)))}{tags[2]}{answer}{tags[3]}"


def _well_formed(rng: random.Random, k: int, names: Sequence[str]) -> str:
    return _answer(rng, " || ".join(rng.choice(names) for _ in range(rng.randint(1, 3))))


_GENERATORS: dict[str, Gen] = {
    "empty": _empty,
    "whitespace_only": _whitespace_only,
    "random_unicode": _random_unicode,
    "invalid_utf8": _invalid_utf8,
    "huge_1mb": _huge_1mb,
    "unclosed_tags": _unclosed_tags,
    "nested_tags": _nested_tags,
    "many_actions": _many_actions,
    "unknown_actions": _unknown_actions,
    "valid_mixed_case": _valid_mixed_case,
    "special_tokens": _special_tokens,
    "huge_numbers": _huge_numbers,
    "boxed_unbalanced": _boxed_unbalanced,
    "latex_sympy_hostile": _latex_sympy_hostile,
    "separators_only": _separators_only,
    "tag_lookalikes": _tag_lookalikes,
    "well_formed": _well_formed,
}
assert tuple(_GENERATORS) == CLASSES


def schedule(n: int, huge_every: int = HUGE_EVERY) -> list[str]:
    """The class of each of the ``n`` texts: round-robin over CLASSES, huge_1mb only every ``huge_every`` rounds."""
    out: list[str] = []
    for rnd in itertools.count():
        if len(out) >= n:
            return out[:n]
        out += [c for c in CLASSES if c != "huge_1mb" or rnd % huge_every == 0]
    raise AssertionError("unreachable")


def hostile_outputs(
    n: int, seed: int, action_names: Sequence[str] = DEFAULT_ACTION_NAMES, huge_every: int = HUGE_EVERY
) -> list[tuple[str, str]]:
    """``n`` (class_name, text) pairs, a pure function of the arguments (see the module docstring)."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    if huge_every < 1:
        raise ValueError(f"huge_every must be >= 1 (got {huge_every})")
    names = tuple(action_names) or DEFAULT_ACTION_NAMES
    ordinal: dict[str, int] = {}
    out = []
    for index, cls in enumerate(schedule(n, huge_every)):
        k = ordinal.get(cls, 0)
        ordinal[cls] = k + 1
        rng = random.Random(f"hostile:{seed}:{index}:{cls}")
        out.append((cls, _GENERATORS[cls](rng, k, names)))
    return out
