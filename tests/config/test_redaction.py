"""The redaction rule (trainer/config/redaction.py) and the writers that use it: secrets in dict fields at any depth
and in URLs are replaced, and nothing else is -- checked against every field of the real configuration classes and
every shipped recipe, so no legitimate setting is ever written as a placeholder."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import io
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from trainer.config.redaction import (
    REDACTED,
    is_secret_key,
    redact,
    redact_url,
    redacted_copy,
    without_placeholders,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_SECRETsecret123"
CPU = {"output_dir": "/tmp/winnow-redaction-test", "use_cpu": True, "bf16": False}


@pytest.mark.parametrize("key", [
    "token", "hub_token", "hf_token", "use_auth_token", "access_token", "refresh_token", "push_to_hub_token",
    "password", "db_password", "passwd", "secret", "client_secret", "authorization", "Authorization", "http_auth",
    "credentials", "cookie", "api_key", "apiKey", "api-key", "wandb_api_key", "OPENAI_API_KEY", "access_key",
    "aws_secret_access_key", "secret_key", "private_key", "accessToken",
    # missed on main (issue "Security II", item 2)
    "apikey", "APIKey", "api_keys", "secrets", "authorization_header", "pwd", "pass", "passphrase", "private_key_pem",
    "private_key_path", "ssh_key", "GITHUB_PAT", "session_id", "X-Amz-Signature",
])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", [
    "max_new_tokens", "max_completion_length", "pad_token", "eos_token", "bos_token", "unk_token", "mask_token",
    "pad_token_id", "eos_token_id", "stop_token_ids", "top_k", "num_tokens", "tokenizer_name_or_path", "key",
    "reward_key", "question_key", "score_key", "checkpoint_key", "state_key", "keys", "tokens", "token_ids",
    "average_tokens_across_devices", "turn_max_tokens", "hub_model_id", "keyword", "monkey", "passes", "bypass",
    "session", "header", "num_iterations", "trackio_space_id", 3, None,
])
def test_non_secret_keys(key):
    assert not is_secret_key(key)


def test_nested_dicts_and_lists_are_redacted_and_the_input_is_untouched():
    value = {
        "model_init_kwargs": {"token": SECRET, "dtype": "bfloat16", "revision": "main"},
        "hub_token": SECRET,
        "max_new_tokens": 16,
        "pad_token": "<|endoftext|>",
        "generation_kwargs": {"eos_token_id": [1, 2], "stop": ["</answer>"]},
        "servers": [{"url": "http://u:pw@10.0.0.2:8000", "api_key": SECRET}, ("x", {"Password": 1234})],
        "nested": {"deeper": {"auth": {"user": "a", "pass": "b"}, "credentials": ["c"]}},
        "use_auth_token": True,
        "token_unset": None,
        "secret": "",
    }
    before = yaml.safe_dump(value)
    assert redact(value) == {
        "model_init_kwargs": {"token": REDACTED, "dtype": "bfloat16", "revision": "main"},
        "hub_token": REDACTED,
        "max_new_tokens": 16,
        "pad_token": "<|endoftext|>",
        "generation_kwargs": {"eos_token_id": [1, 2], "stop": ["</answer>"]},
        "servers": [{"url": "http://***@10.0.0.2:8000", "api_key": REDACTED}, ("x", {"Password": REDACTED})],
        "nested": {"deeper": {"auth": REDACTED, "credentials": REDACTED}},
        "use_auth_token": True,  # a bool says "use the stored login": nothing to hide, and a re-run means the same
        "token_unset": None,
        "secret": "",
    }
    assert yaml.safe_dump(value) == before
    # transformers' own mask of a top-level token field stays as transformers wrote it
    assert redact({"hub_token": "<HUB_TOKEN>"}) == {"hub_token": "<HUB_TOKEN>"}


@pytest.mark.parametrize("text, expected", [
    ("http://user:pass@host:8000", "http://***@host:8000"),
    ("https://user:p@ss@host/v1?a=1", "https://***@host/v1?a=1"),  # a raw '@' in the password
    ("https://ghp_TOKEN@github.com/o/r.git", "https://***@github.com/o/r.git"),
    ("http://h:1/x?token=abc&b=2&api_key=k", "http://h:1/x?token=***&b=2&api_key=***"),
    ("http://h/#access_token=abc&state=s", "http://h/#access_token=***&state=s"),
    ("vLLM server http://u:p@h:8000 not up; see http://docs/x@y", "vLLM server http://***@h:8000 not up; see "
     "http://docs/x@y"),  # an '@' in a path is not user-info
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://h/x?max_new_tokens=5&key=3&token=", "http://h/x?max_new_tokens=5&key=***&token="),
    # what the rule missed on main (issue "Security II", item 2): one-word secret parameters, signed URLs, passwords
    # holding '/', '?', '#' or a quote, and HTTP credentials written into text
    ("http://h/x?apikey=a&sig=b&X-Amz-Signature=c&X-Amz-Date=d", "http://h/x?apikey=***&sig=***&X-Amz-Signature=***"
     "&X-Amz-Date=d"),
    ("http://user:pa/ss@host:8000/v1", "http://***@host:8000/v1"),
    ("http://user:p?a#s@host", "http://***@host"),
    ("'http://user:it's@host'", "'http://***@host'"),
    ("curl -H 'Authorization: Bearer sk-abcdef123456'", "curl -H 'Authorization: Bearer ***'"),
    ("Authorization: Basic YXBpOnNlY3JldGtleTEyMzQ=", "Authorization: Basic ***"),
    ("Basic usage: pass a recipe", "Basic usage: pass a recipe"),
    ("user:pass@host", "user:pass@host"),  # not a URL
    ("a=b&token=c", "a=b&token=c"),
])
def test_url_user_info_and_secret_query_values(text, expected):
    assert redact_url(text) == expected
    assert redact({"anything": text}) == {"anything": expected}


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def test_no_field_of_the_real_configuration_is_a_secret_but_hub_token():
    """Every field of WinnowConfig (TRL's GRPOConfig and transformers' TrainingArguments included), TaskArguments and
    ModelConfig, with its default: the rule redacts nothing but ``hub_token``. A new field named like a secret fails
    here, to be looked at."""
    from trl import ModelConfig

    from trainer.config.core import WinnowConfig
    from trainer.recipe import TaskArguments

    flagged = set()
    for cls in (WinnowConfig, TaskArguments, ModelConfig):
        for f in dataclasses.fields(cls):
            value = _default(f)
            if is_secret_key(f.name):
                flagged.add(f.name)
                continue
            assert redact({f.name: value}) == {f.name: value}, f"{cls.__name__}.{f.name}"
    assert flagged == {"hub_token"}


def test_every_shipped_recipe_is_left_alone():
    """Every key and value of every recipe and eval config under configs/ (dataset, env, chat-template and
    generation kwargs included) comes back unchanged."""
    files = sorted((ROOT / "configs").rglob("*.yaml"))
    assert len(files) > 50
    for path in files:
        raw = yaml.safe_load(path.read_text())
        assert redact(raw) == raw, path.relative_to(ROOT)


def test_the_resolved_recipe_of_a_real_parse_is_left_alone_without_secrets(tmp_path):
    from trainer.recipe import _plain, parse_recipe, resolved_recipe

    task, args, model_args = parse_recipe(["--config", str(ROOT / "configs/demo/smollm2-arithmetic.yaml"),
                                           "--output_dir", str(tmp_path)])
    plain = {f.name: _plain(getattr(obj, f.name)) for obj in (task, model_args, args)
             for f in dataclasses.fields(obj) if f.init}
    resolved = resolved_recipe(task, args, model_args)
    assert resolved == {k: v for k, v in plain.items() if k in resolved}


def _winnow(**kw):
    from trainer.config.core import WinnowConfig

    return WinnowConfig(**CPU, **kw)


def _secret_args():
    return _winnow(hub_token=SECRET + "A", model_init_kwargs={"token": SECRET + "B", "dtype": "float32"},
                   vllm_server_base_url=f"http://user:{SECRET}C@10.0.0.2:8000")


def test_redacted_copy_leaves_the_running_args_alone():
    args = _secret_args()
    clone = redacted_copy(args)
    assert type(clone) is type(args)
    assert (clone.hub_token, clone.model_init_kwargs, clone.vllm_server_base_url) == (
        REDACTED, {"token": REDACTED, "dtype": "float32"}, "http://***@10.0.0.2:8000")
    assert (args.hub_token, args.model_init_kwargs, args.vllm_server_base_url) == (
        SECRET + "A", {"token": SECRET + "B", "dtype": "float32"}, f"http://user:{SECRET}C@10.0.0.2:8000")
    assert clone.learning_rate == args.learning_rate and clone.output_dir == args.output_dir


def test_to_dict_str_and_repr_carry_no_secret():
    """What W&B / TensorBoard / MLflow log (``args.to_dict()``) and what printing the args shows."""
    args = _secret_args()
    shown = args.to_dict()
    assert shown["model_init_kwargs"] == {"token": REDACTED, "dtype": "float32"}
    assert shown["vllm_server_base_url"] == "http://***@10.0.0.2:8000"
    assert shown["hub_token"] == "<HUB_TOKEN>"  # transformers' mask, as a plain GRPOConfig shows it
    for text in (args.to_json_string(), str(args), repr(args)):
        assert SECRET not in text
    assert args.model_init_kwargs["token"] == SECRET + "B"  # still there for the model load


def test_training_args_pickle_is_redacted_and_the_args_keep_their_secrets():
    """What ``WinnowGRPOTrainer.save_model`` / ``_save_checkpoint`` do around transformers'
    ``torch.save(self.args, training_args.bin)``."""
    from trainer.config.core import WinnowConfig, pickled_redacted

    args = _secret_args()
    buf = io.BytesIO()
    with pickled_redacted(args):
        assert args.hub_token == SECRET + "A" and isinstance(args, WinnowConfig)  # attribute reads see the real ones
        torch.save(args, buf)
        plain_pickles = [pickle.dumps(args, protocol=p) for p in (0, 2, pickle.HIGHEST_PROTOCOL)]
    assert type(args) is WinnowConfig and args.model_init_kwargs["token"] == SECRET + "B"
    for raw in (buf.getvalue(), *plain_pickles):
        assert SECRET.encode() not in raw
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert type(loaded) is WinnowConfig
    assert (loaded.hub_token, loaded.model_init_kwargs["token"], loaded.vllm_server_base_url) == (
        REDACTED, REDACTED, "http://***@10.0.0.2:8000")
    assert loaded.to_dict() == args.to_dict()  # the same configuration but for the secrets
    assert SECRET.encode() in pickle.dumps(args)  # outside a save, the args pickle as they are


def test_transformers_writes_training_args_only_where_winnow_redacts():
    """``training_args.bin`` is written by two Trainer methods, each called only from a method WinnowGRPOTrainer
    wraps in ``pickled_redacted`` (``_save`` from ``save_model``, ``_push_from_checkpoint`` from ``_save_checkpoint``);
    a transformers or TRL release that writes it, or calls a writer, from anywhere else fails here (the new place
    would write the secrets)."""
    writers, callers = set(), {}
    trees = {}
    for module in ("transformers.trainer", "trl.trainer.grpo_trainer", "trl.trainer.base_trainer"):
        spec = importlib.util.find_spec(module)
        if spec is not None:
            trees[module] = ast.parse(Path(spec.origin).read_text())
    for module, tree in trees.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == "torch.save"]
                if any("self.args" == ast.unparse(c.args[0]) for c in calls if c.args) or any(
                        isinstance(n, ast.Name) and n.id == "TRAINING_ARGS_NAME" for n in ast.walk(fn)):
                    writers.add(f"{module}.{fn.name}")
    assert writers == {"transformers.trainer._save", "transformers.trainer._push_from_checkpoint"}
    for module, tree in trees.items():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                for c in ast.walk(fn):
                    if isinstance(c, ast.Call) and ast.unparse(c.func) in ("self._save", "self._push_from_checkpoint"):
                        callers.setdefault(ast.unparse(c.func), set()).add(fn.name)
    assert callers == {"self._save": {"save_model"}, "self._push_from_checkpoint": {"_save_checkpoint"}}
    from trainer.grpo_trainer import WinnowGRPOTrainer

    assert {"save_model", "_save_checkpoint"} <= set(vars(WinnowGRPOTrainer))


def test_a_re_run_drops_the_placeholder_so_the_environment_gives_the_token(tmp_path):
    """recipe.resolved.yaml says ``token: <redacted>``; parsed again, the placeholder is dropped (with a warning) so
    transformers reads HF_TOKEN / the stored login instead of sending it."""
    from trainer.recipe import parse_recipe, resolved_recipe, save_resolved_recipe

    argv = ["--config", str(ROOT / "configs/demo/smollm2-arithmetic.yaml"), "--output_dir", str(tmp_path / "o"),
            "--model_init_kwargs", '{"token": "%s", "revision": "main"}' % SECRET,
            "--vllm_server_base_url", f"http://me:{SECRET}@10.0.0.2:8000", "--hub_token", SECRET]
    task, args, model_args = parse_recipe(argv)
    assert args.model_init_kwargs["token"] == SECRET
    path = tmp_path / "recipe.resolved.yaml"
    save_resolved_recipe(resolved_recipe(task, args, model_args), path)
    text = path.read_text()
    assert SECRET not in text
    written = yaml.safe_load(text)
    assert written["model_init_kwargs"] == {"token": REDACTED, "revision": "main"}
    assert written["vllm_server_base_url"] == "http://***@10.0.0.2:8000" and "hub_token" not in written
    with pytest.warns(UserWarning, match="model_init_kwargs.token: '<redacted>' is the placeholder"):
        _, again, _ = parse_recipe(["--config", str(path)])
    assert again.model_init_kwargs == {"revision": "main"}


def test_without_placeholders():
    assert without_placeholders({"a": {"token": REDACTED, "x": [1, {"k": REDACTED}]}, "b": 2}) == (
        {"a": {"x": [1, {}]}, "b": 2}, ["a.token", "a.x[1].k"])
    value = {"a": 1}
    assert without_placeholders(value) == (value, []) and without_placeholders(value)[0] is value


def test_eval_config_record_and_server_errors_carry_no_password():
    from trainer.eval.runner import EvalConfig, _config_record
    from trainer.server.client import GenerationServerError

    raw = yaml.safe_load((ROOT / "configs" / "eval" / "grpodropout.yaml").read_text())
    raw["systems"] = [{"name": "s", "model": "m", "backend": "server", "base_url": f"http://u:{SECRET}@h:8000"}]
    cfg = EvalConfig.from_dict(raw)
    record = _config_record(cfg, cfg.systems[0])
    assert record["system"]["base_url"] == "http://***@h:8000" and SECRET not in str(record)
    error = GenerationServerError(f"http://u:{SECRET}@h:8000/health", f"failed at http://u:{SECRET}@h:8000/x")
    assert SECRET not in str(error) and error.server == "***@h:8000" and error.endpoint == "/health"


def test_server_wait_logs_carry_no_password(caplog):
    """The startup wait's retry lines name the server and the request's error, which quotes the URL."""
    import logging

    from trainer.server.client import GenerationServerError, wait_for_server

    caplog.set_level(logging.INFO, logger="trainer.server.client")
    with pytest.raises(GenerationServerError) as error:  # no connection adapter for the scheme: fails at once
        wait_for_server(f"nohttp://u:{SECRET}@127.0.0.1:9", total_timeout=0.3, retry_interval=0.1)
    assert "not up yet" in caplog.text and "nohttp://***@127.0.0.1:9" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(error.value)


@pytest.mark.parametrize("argv, expected", [
    (["--hub_token", SECRET, "--model", "m"], ["--hub_token", REDACTED, "--model", "m"]),
    (["--hf-token=" + SECRET, "--api-key", "k", "--max_new_tokens", "5"],
     ["--hf-token=" + REDACTED, "--api-key", REDACTED, "--max_new_tokens", "5"]),
    (["--vllm_server_base_url", "http://user:p w/d@10.0.0.2:8000"], ["--vllm_server_base_url", "http://***@10.0.0.2:8000"]),
    (["--", "--enable-prefix-caching"], ["--", "--enable-prefix-caching"]),
])
def test_a_command_line_is_redacted_flag_by_flag(argv, expected):
    """W&B records sys.argv and the launcher logs its command line (issue "Security II", item 2): a secret flag's
    value, given as the next argument or after '=', is hidden, and a URL argument is read whole (its password may
    hold spaces)."""
    from trainer.config.redaction import redact_argv

    assert redact_argv(argv) == expected
