"""Locate the reasoning Z of a sampled turn in its *text* and map it back to the sampled token ids.

For tokenizers without single-token think tags (Qwen2.5, every RAGEN recipe model), ``<think>``/``</think>`` are
several tokens that can merge with their neighbours, so the tags cannot be found as token ids. RAGEN finds Z as the
text between the tags, stripped (mll-lab-nu/RAGEN@20daedc ragen/llm_agent/ctx_manager.py:660-671, 727-740), and then
re-tokenises it; here the span is found the same way in the decoded text and Z is the run of *sampled* ids whose
characters lie inside it, less leading/trailing whitespace-only tokens, so no re-tokenisation drift. A sampled token
that straddles a tag (e.g. ``.</`` for ``up.</think>``) is left out: its reasoning characters are lost to Z rather
than re-tokenised.
"""

from __future__ import annotations

from typing import Any, Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def token_char_ends(tokenizer: Any, ids: Sequence[int], limit: int) -> list[int | None]:
    """End offset in ``decode(ids)`` of each token's text, for the tokens ending at or before ``limit``
    characters (prefix decoding; None where a token ends inside a multi-byte character)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    ends: list[int | None] = []
    for k in range(len(ids)):
        prefix = tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=False)
        ends.append(len(prefix) if text.startswith(prefix) else None)
        if ends[-1] is not None and ends[-1] >= limit:
            break
    return ends


def reasoning_token_span(tokenizer: Any, ids: Sequence[int], prefilled: bool) -> tuple[int, int] | None:
    """(start, end) token indices of Z in ``ids`` (a sampled turn), or None when the turn has no complete,
    non-empty reasoning. ``prefilled``: the context already ends with ``<think>`` (the think prefill), so the
    reasoning starts at the turn's first character."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    if prefilled:
        a = 0
    else:
        a = text.find(THINK_OPEN)
        if a < 0:
            return None
        a += len(THINK_OPEN)
    b = text.find(THINK_CLOSE, a)
    if b < 0:
        return None
    if not text[a:b].strip():
        return None  # empty reasoning (RAGEN strips it and skips the turn)
    ends = token_char_ends(tokenizer, ids, b)
    inside: list[int] = []
    previous = 0
    for k, e in enumerate(ends):
        if e is None:
            continue
        begin, previous = previous, e
        if begin >= a and e <= b:
            inside.append(k)
    # RAGEN strips the reasoning text: leading/trailing tokens that are only whitespace leave Z
    while inside and not tokenizer.decode([ids[inside[0]]], skip_special_tokens=False).strip():
        inside.pop(0)
    while inside and not tokenizer.decode([ids[inside[-1]]], skip_special_tokens=False).strip():
        inside.pop()
    if not inside:
        return None
    return inside[0], inside[-1] + 1
