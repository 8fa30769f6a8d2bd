"""trainer.data.generic: a Hub id or local path in dataset_name, read as TRL's scripts read it (issue 35, items 1-2).

The prompt column is used as it is (a string, or chat messages never stringified), every other column is kept with
its values and types, verl's parquet reads with a column mapping, and every mistake is one line that says what to do.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

import datasets  # noqa: E402
import pytest  # noqa: E402
from harness import typed, write_rows  # noqa: E402

from trainer.build import filter_long_prompts
from trainer.config.dataset_fields import check_dataset_fields, load_generic_inputs  # noqa: E402
from trainer.config.errors import RecipeError  # noqa: E402
from trainer.config.recipe_checks import check_dataset, probe_rewards  # noqa: E402
from trainer.data import (  # noqa: E402
    DatasetUnavailableError,
    MissingSplitError,
    list_task_datasets,
    load_generic,
    load_task_dataset,
)
from trainer.data.generic import column_value, load_generic_split  # noqa: E402
from trainer.recipe import TaskArguments  # noqa: E402

CHAT_ROWS = [
    {"prompt": [{"role": "system", "content": "Think first."}, {"role": "user", "content": "What is 1+1?"}],
     "solution": "2", "meta": {"level": 1, "tags": ["easy", "add"], "weight": 0.5}, "steps": [1, 2], "flag": True},
    {"prompt": [{"role": "user", "content": "What is {2}*3? Answer in \\boxed{}."}],
     "solution": "6", "meta": {"level": 3, "tags": [], "weight": 1.25}, "steps": [], "flag": False},
]

VERL_ROWS = [  # verl's RL parquet (examples/data_preprocess/gsm8k.py): chat prompt, nested ground truth
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Natalia sold 48 clips... #### "}],
     "ability": "math", "reward_model": {"ground_truth": "72", "style": "rule"},
     "extra_info": {"index": 0, "split": "train", "answer": "Natalia sold 48/2 = 24 clips... #### 72"}},
    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Weng earns $12 an hour... #### "}],
     "ability": "math", "reward_model": {"ground_truth": "10", "style": "rule"},
     "extra_info": {"index": 1, "split": "train", "answer": "Weng earns 12/60 = $0.2 per minute... #### 10"}},
]


def task(name, **fields):
    return TaskArguments(dataset_name=name, **fields)


class Args:  # the WinnowConfig fields the dataset checks read
    max_steps = 1
    dynamic_sampling = False
    low_success_stop_steps = 0
    eval_strategy = "no"


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_chat_prompt_and_every_other_column_reach_the_dataset_as_written(tmp_path, suffix):
    ds = load_generic(write_rows(CHAT_ROWS, tmp_path / f"chat{suffix}"))
    assert ds.column_names == list(CHAT_ROWS[0])  # nothing added (no answer/source), nothing dropped
    assert typed(ds.to_list()) == typed(CHAT_ROWS)
    assert isinstance(ds[0]["prompt"], list)  # chat messages, never "[{'role': ...}]" text


def test_string_prompt_is_kept_as_a_string(tmp_path):
    rows = [{"prompt": "Q: 1+1?\nA:", "answer": 2}, {"prompt": "Q: {x}?\nA:", "answer": 3}]
    ds = load_generic(write_rows(rows, tmp_path / "plain.jsonl"))
    assert typed(ds.to_list()) == typed(rows)


def test_verl_parquet_reads_with_a_column_mapping(tmp_path):
    path = write_rows(VERL_ROWS, tmp_path / "gsm8k_train.parquet")
    ds = load_generic(path, columns={"answer": "reward_model.ground_truth", "style": "reward_model.style"})
    assert ds["answer"] == ["72", "10"] and ds["style"] == ["rule", "rule"]
    assert typed([{k: r[k] for k in VERL_ROWS[0]} for r in ds.to_list()]) == typed(VERL_ROWS)  # sources untouched
    # a mapped gold answer is what winnow's math rewards read
    from rewards import get_reward

    score = get_reward("math_accuracy")(prompts=ds["prompt"], completions=[[{"role": "assistant", "content": c}]
                                                                            for c in ("\\boxed{72}", "\\boxed{11}")],
                                        completion_ids=[[], []], answer=ds["answer"])
    assert score == [1.0, 0.0]


def test_column_paths():
    row = {"a.b": 1, "a": {"b": 2, "c": [{"d": 3}]}}
    assert column_value(row, "a.b") == 1  # a column whose name holds a dot wins
    assert column_value(row, "a.c.0.d") == 3 and column_value(row, "a.c.-1") == {"d": 3}
    with pytest.raises(KeyError, match=r"'a.x': a has no 'x' \(it holds \['b', 'c'\]\)"):
        column_value(row, "a.x")


def test_a_missing_prompt_column_or_a_bad_mapping_is_refused_naming_the_fix(tmp_path):
    path = write_rows([{"question": "1+1?", "answer": "2"}], tmp_path / "qa.jsonl")
    with pytest.raises(RecipeError) as e:
        load_generic_inputs(task(path), "no")
    line = str(e.value)
    assert line.startswith("dataset_name: ") and "no 'prompt' column" in line and "['question', 'answer']" in line
    assert "dataset_columns: {prompt: question}" in line.split("Fix:")[1] and "\n" not in line

    train, _ = load_generic_inputs(task(path, dataset_columns={"prompt": "question"}), "no")
    assert train.to_list() == [{"question": "1+1?", "answer": "2", "prompt": "1+1?"}]

    verl = write_rows(VERL_ROWS, tmp_path / "verl.parquet")
    with pytest.raises(RecipeError, match=r"^dataset_columns: .*'reward_model.truth': reward_model has no 'truth' "
                       r"\(it holds \['ground_truth', 'style'\]\)"):
        load_generic_inputs(task(verl, dataset_columns='{"answer": "reward_model.truth"}'), "no")
    with pytest.raises(RecipeError, match=r"^dataset_columns: .*'prompt' \(mapped from 'extra_info'\) must be a "
                       "string or a list of {role, content} messages"):
        load_generic_inputs(task(verl, dataset_columns={"prompt": "extra_info"}), "no")
    with pytest.raises(RecipeError, match="^dataset_columns: must map new column names"):
        task(verl, dataset_columns={"answer": 3})
    with pytest.raises(RecipeError, match=r"^dataset_kwargs: \['path'\] are not options of a Hub id or local path"):
        load_generic_inputs(task(verl, dataset_kwargs={"path": verl}), "no")


def test_a_hub_id_offline_and_not_cached_is_one_line_with_the_fix():
    assert datasets.config.HF_HUB_OFFLINE
    with pytest.raises(DatasetUnavailableError) as e:
        load_generic("nobody-xyz/no-such-dataset")
    assert "\n" not in str(e.value) and "HF_HUB_OFFLINE is set" in str(e.value)
    assert "hf download --repo-type dataset" in str(e.value).split("Fix:")[1]
    with pytest.raises(RecipeError) as e:  # as the launch reports it: the field, what, and what to do
        load_generic_inputs(task("arithmetics"), "no")
    line = str(e.value)
    assert line.startswith("dataset_name: 'arithmetics' is not a registered loader") and "\n" not in line
    assert line.count("Fix:") == 1 and "did you mean the registered 'arithmetic'?" in line.split("Fix:")[1]
    assert "hf download --repo-type dataset" in line.split("Fix:")[1]


def test_splits_and_the_evaluation_set(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(CHAT_ROWS, folder / "train.parquet")
    write_rows(CHAT_ROWS[:1], folder / "test.parquet")
    train, test = load_generic_inputs(task(str(folder)), "steps")
    assert (len(train), len(test)) == (2, 1) and typed(test.to_list()) == typed(CHAT_ROWS[:1])
    assert load_generic_inputs(task(str(folder)), "no")[1] is None  # no evaluation: the test split is not read
    with pytest.raises(RecipeError, match=r"^dataset_train_split: .*Unknown split \"validation\""):
        load_generic_inputs(task(str(folder), dataset_train_split="validation"), "no")
    with pytest.raises(RecipeError, match=r"^eval_strategy: no evaluation set: .*Unknown split \"dev\".*Fix: set "
                       "eval_strategy: no"):
        load_generic_inputs(task(str(folder), dataset_test_split="dev"), "steps")
    # a single file is the training set, whatever the split is called: it has no test split to evaluate on
    single = write_rows(CHAT_ROWS, tmp_path / "one.parquet")
    with pytest.raises(MissingSplitError, match="single file"):
        load_generic_split(single, "test")
    with pytest.raises(RecipeError, match="^eval_strategy: no evaluation set: .* single file"):
        load_generic_inputs(task(single), "steps")
    # a save_to_disk DatasetDict names its splits
    datasets.DatasetDict({"train": datasets.Dataset.from_list(CHAT_ROWS)}).save_to_disk(str(tmp_path / "saved"))
    assert typed(load_generic(str(tmp_path / "saved")).to_list()) == typed(CHAT_ROWS)
    with pytest.raises(MissingSplitError, match=r"no split 'test' .* splits: \['train'\]"):
        load_generic_split(str(tmp_path / "saved"), "test")


def test_sampling_options(tmp_path):
    rows = [{"prompt": f"q{i}", "i": i} for i in range(10)]
    path = write_rows(rows, tmp_path / "ten.jsonl")
    assert load_generic(path, num_samples=3)["i"] == [0, 1, 2]
    shuffled = load_generic(path, num_samples=3, shuffle=True, seed=1)["i"]
    assert shuffled == load_generic(path, num_samples=3, shuffle=True, seed=1)["i"] != [0, 1, 2]


class WordTokenizer:
    """One token per word: the chat template joins the messages' contents, a plain prompt is tokenized as is."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **kwargs):
        return " ".join(m["content"] for m in messages).split() + ["<gen>"]

    def __call__(self, text):
        return {"input_ids": text.split()}


@pytest.mark.parametrize("streaming", [False, True])
def test_streamed_or_not_the_prompt_checks_and_the_token_filter_work(tmp_path, streaming):
    """What prepare_run does with a generic dataset: the empty check, the reward probe on the first row and
    max_prompt_tokens, on chat and string prompts; a streamed dataset (no len(), no indexing) included."""
    chat = load_generic(write_rows(CHAT_ROWS, tmp_path / "chat.parquet"), streaming=streaming)
    assert isinstance(chat, datasets.IterableDataset) == streaming
    check_dataset(chat, task("x"))
    seen = []
    probe_rewards([lambda prompts, completions, **kw: seen.append((prompts, completions, kw)) or [0.0]], ["rec"],
                  chat)
    prompts, completions, kwargs = seen[0]
    assert prompts == [CHAT_ROWS[0]["prompt"]] and completions == [[{"role": "assistant", "content": ""}]]
    assert typed({k: kwargs[k] for k in ("solution", "meta", "steps", "flag")}) == typed(
        {k: [CHAT_ROWS[0][k]] for k in ("solution", "meta", "steps", "flag")})
    # 5 words + <gen> in the first prompt, 6 + <gen> in the second
    kept = filter_long_prompts(chat, WordTokenizer(), 6, {})
    assert typed(list(kept)) == typed(CHAT_ROWS[:1])
    plain = load_generic(write_rows([{"prompt": "a b c", "x": 1}, {"prompt": "a b c d e f", "x": 2}],
                                    tmp_path / "plain.jsonl"), streaming=streaming)
    assert list(filter_long_prompts(plain, WordTokenizer(), 5, {})) == [{"prompt": "a b c", "x": 1}]
    empty = filter_long_prompts(plain, WordTokenizer(), 1, {})
    with pytest.raises(RecipeError, match="^dataset_kwargs: .* has 0 rows"):
        check_dataset(empty, task("x"))


def test_registered_names_keep_their_loaders_and_refuse_the_generic_fields(tmp_path):
    assert set(list_task_datasets()) == {"arithmetic", "champ", "countdown", "dapo_math_17k", "deepmath_103k",
                                         "frozenlake", "json", "metamathqa", "sokoban"}
    ds = load_task_dataset("arithmetic", num_samples=3, seed=1)
    assert ds.column_names == ["prompt", "answer", "source"] and isinstance(ds[0]["prompt"], list)
    check_dataset_fields(task("arithmetic"), Args)  # the defaults of the generic fields are fine
    for name, value in [("dataset_streaming", True), ("dataset_config", "main"), ("dataset_train_split", "test"),
                        ("dataset_test_split", "dev"), ("dataset_columns", {"answer": "x"})]:
        with pytest.raises(RecipeError, match=f"^{name}: applies to a Hub id or local path in dataset_name, not to "
                           "the registered loader 'arithmetic'"):
            check_dataset_fields(task("arithmetic", **{name: value}), Args)


def test_streaming_needs_max_steps_and_no_dynamic_sampling():
    class NoMaxSteps(Args):
        max_steps = -1

    class Dynamic(Args):
        dynamic_sampling = True

    check_dataset_fields(task("org/data", dataset_streaming=True), Args)
    with pytest.raises(RecipeError, match="^dataset_streaming: .*Fix: set max_steps: N"):
        check_dataset_fields(task("org/data", dataset_streaming=True), NoMaxSteps)
    with pytest.raises(RecipeError, match="^dataset_streaming: dynamic_sampling refills"):
        check_dataset_fields(task("org/data", dataset_streaming=True), Dynamic)


def test_the_low_success_stop_is_refused_on_a_generic_evaluation():
    """It reads env/success_rate, which only the environment tasks' evaluation logs: refused before weights load
    instead of failing at the first evaluation."""
    class Stop(Args):
        low_success_stop_steps = 5
        eval_strategy = "steps"

    with pytest.raises(RecipeError, match="^low_success_stop_steps: .*Fix: set low_success_stop_steps: 0"):
        check_dataset_fields(task("org/data"), Stop)


def test_the_json_loader_refuses_a_column_of_chat_messages(tmp_path):
    """It used to write str(messages) into its template without a word; the fix names the path that keeps them."""
    path = write_rows([{"prompt": CHAT_ROWS[0]["prompt"], "answer": "2"}], tmp_path / "chat.jsonl")
    with pytest.raises(ValueError, match=f"holds a list .* Use dataset_name: {path} "):
        load_task_dataset("json", path=path, problem_column="prompt")
    plain = write_rows([{"problem": "1+1?", "answer": 2}], tmp_path / "plain.jsonl")  # unchanged
    assert load_task_dataset("json", path=plain)[0]["prompt"][-1]["content"].startswith("1+1?\n\nPlease reason")


OPEN_R1_ROWS = [  # open-r1/OpenR1-Math-220k's columns (problem, solution, answer, problem_type, ...)
    {"problem": "Compute $2+3$.", "solution": "We add: $2+3=\\boxed{5}$.", "answer": "5", "problem_type": "Algebra"},
    {"problem": "Compute $4\\cdot 2$.", "solution": "$4\\cdot 2=\\boxed{8}$", "answer": "8",
     "problem_type": "Algebra"},
]


@pytest.mark.parametrize("system", [None, "Think in <think> tags."])
def test_open_r1_prompt_column_and_system_prompt_build_its_conversation(tmp_path, system):
    """As open-r1's grpo.py make_conversation: [system message if system_prompt] + the column as the user message;
    every column, the source one included, stays."""
    path = write_rows(OPEN_R1_ROWS, tmp_path / "openr1.parquet")
    ds = load_generic(str(path), prompt_column="problem", system_prompt=system)
    head = [{"role": "system", "content": system}] if system else []
    assert ds["prompt"] == [head + [{"role": "user", "content": r["problem"]}] for r in OPEN_R1_ROWS]
    for key in ("problem", "solution", "answer", "problem_type"):
        assert ds[key] == [r[key] for r in OPEN_R1_ROWS]


def test_the_prompt_column_must_exist_and_hold_text_and_system_prompt_needs_it(tmp_path):
    path = str(write_rows(OPEN_R1_ROWS, tmp_path / "openr1.parquet"))
    with pytest.raises(RecipeError, match=r"dataset_name: .*dataset_prompt_column 'question' is not a column"):
        load_generic_inputs(task(path, dataset_prompt_column="question"), "no")
    with pytest.raises(RecipeError, match=r"^system_prompt: .*Fix: set dataset_prompt_column"):
        task(path, system_prompt="Be brief.")
