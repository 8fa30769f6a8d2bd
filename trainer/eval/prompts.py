"""Evaluation prompt presets: the chat messages a question becomes (``prompt:`` in an eval YAML).

``default``: one user message, :data:`~trainer.eval.benchmarks.MATH_PROMPT` / ``CHOICE_PROMPT`` (the question
with the instruction appended; no system message).

``grpodropout``: the GRPODropout authors' evaluation, token for token
(hexuandeng/GRPODropout@4ad3b3bc2f66e1e356efe6e674011fb4d726b2dc):

- eval/scripts/run_sampling_eval.sh (L15, L20, L21, L73) and run_greedy_eval.sh (L14, L20, L21, L74) run
  eval/eval.py with ``PROMPT=qwen``, ``ENABLE_THINKING=true``, ``USE_VERL_PROMPT=false`` and
  ``--surround_with_messages``;
- eval/eval.py ``get_three_prompt`` reads eval/prompts/qwen/math.py for math sets and eval/prompts/qwen/qa.py
  for arc_challenge, mmlu_pro, supergpqa, gpqa_diamond; ``build_prompt_for_example`` then sends
  ``[system: SYSTEM_PROMPT, user: content]`` through the chat template, where content is the **raw** question
  for math sets (``question_format`` is applied to choice sets only) and ``question_format.format(question=q)``
  for choice sets;
- eval/prompts/qwen/math.py L1 and eval/prompts/qwen/qa.py L1 (system prompts), qa.py L4 ("Question:
  {question}\\n\\nSolution:");
- eval/utils/parser.py ``parse_question`` (L86-90): the question stripped; for choice sets
  ``f"{question}\\n\\n{choices}".strip()`` with ``_format_choices`` (L76-83) lines ``"{label}. {text}"``.

One deliberate difference: upstream's ARC-Challenge file keeps numeric option labels ("1".."4") where the hub
row has them; our loader relabels every option A.. in order (benchmarks.py), so grading is the same for all sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.eval.benchmarks import CHOICE_PROMPT, LETTERS, MATH_PROMPT, EvalItem, format_options

GRPODROPOUT_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
GRPODROPOUT_CHOICE_SYSTEM = (
    'Answer the following multiple-choice question. Think step by step and then finish your answer with '
    '"The answer is (X)" where X is the correct letter choice.'
)


@dataclass(frozen=True)
class PromptPreset:
    """How a question becomes chat messages: an optional system message and a user template per item kind.
    Templates take ``question``, ``options`` ("A. text" lines) and ``letters``; literal braces are doubled."""

    math_user: str
    choice_user: str
    math_system: str | None = None
    choice_system: str | None = None
    strip: bool = False  # strip the question and each option text (upstream's parse_question does)


PROMPT_PRESETS: dict[str, PromptPreset] = {
    "default": PromptPreset(math_user=MATH_PROMPT, choice_user=CHOICE_PROMPT),
    "grpodropout": PromptPreset(
        math_user="{question}",
        choice_user="Question: {question}\n\n{options}\n\nSolution:",
        math_system=GRPODROPOUT_MATH_SYSTEM,
        choice_system=GRPODROPOUT_CHOICE_SYSTEM,
        strip=True,
    ),
}


def prompt_messages(item: EvalItem, preset: str = "default") -> list[dict[str, str]]:
    """Chat messages for ``item`` under the named preset (a system message first when the preset has one)."""
    if preset not in PROMPT_PRESETS:
        raise ValueError(f"prompt: unknown preset {preset!r}; known: {sorted(PROMPT_PRESETS)}")
    if item.kind not in ("math", "choice"):
        raise ValueError(f"{item.benchmark}/{item.id}: unknown item kind {item.kind!r} (expected 'math' or 'choice')")
    p = PROMPT_PRESETS[preset]
    question, choices = item.question, list(item.choices)
    if p.strip:
        question, choices = question.strip(), [str(c).strip() for c in choices]
    math = item.kind == "math"
    template, system = (p.math_user, p.math_system) if math else (p.choice_user, p.choice_system)
    content = template.format(question=question, options=format_options(choices),
                              letters=", ".join(LETTERS[: len(choices)]))
    return ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": content}
    ]
