"""What winnow writes or logs about a run carries no secret: the one redaction rule, as pure functions.

Used by every writer of the configuration: ``recipe.resolved.yaml`` (trainer/recipe.py), the configuration
that W&B / TensorBoard / MLflow log and ``str(args)`` (``WinnowConfig.to_dict``, trainer/config/core.py),
``training_args.bin`` in the run folder and every checkpoint (``WinnowGRPOTrainer._save``), an evaluation's
``config.json`` (trainer/eval/runner.py), the server client's messages and the printed preflight and error lines.

The rule, on a key of any mapping at any depth (a dataclass field name counts as a key). The key is read in
snake_case, lower case (``apiKey`` and ``api-key`` read ``api_key``); it names a secret when

* its last word is ``token``, ``password``, ``passwd``, ``secret``, ``auth``, ``authorization``, ``credential(s)``
  or ``cookie`` (``token``, ``hub_token``, ``use_auth_token``, ``client_secret``, ``http_auth``), except the
  tokenizer's special tokens (``pad_token``, ``eos_token``, ... :data:`SPECIAL_TOKENS`), whose values are vocabulary;
* or its last two words are ``api_key``, ``access_key``, ``secret_key``, ``private_key``, ``auth_key``,
  ``signing_key`` or ``encryption_key`` (``wandb_api_key``, ``aws_secret_access_key``) -- not any ``*_key``:
  ``reward_key`` or ``question_key`` name columns.

A secret key's value becomes :data:`REDACTED` unless there is nothing to hide: None, a bool (``use_auth_token:
true``), an empty string, or transformers' own mask of the field (``<HUB_TOKEN>``). Names in the plural
(``max_new_tokens``), ``*_token_id`` and ``*_tokens`` are counts and ids, never secrets.

And on every string, wherever it sits: in each URL (``scheme://...``) the user-info becomes ``***``
(``http://user:pass@host:8000`` -> ``http://***@host:8000``), and so does the value of a query or fragment
parameter whose name is a secret by the rule above (``?token=...``, ``&api_key=...``).

A redacted value is a placeholder, not a value: a re-run of a ``recipe.resolved.yaml`` that needs the secret gets it
from the environment (the Hugging Face token from ``HF_TOKEN`` or ``hf auth login``: ``WinnowConfig`` drops a
:data:`REDACTED` value from its mappings, so the library falls back to those) or from the command line
(``--vllm_server_base_url http://user:pass@host:8000``).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
URL_REDACTED = "***"  # inside a URL: plain URL characters, so the redacted URL still parses

SECRET_WORDS = frozenset({"token", "password", "passwd", "pwd", "pass", "passphrase", "secret", "secrets", "auth",
                          "authorization", "credential", "credentials", "cookie", "apikey", "signature", "pat"})
SECRET_KEY_KINDS = frozenset({"api", "access", "secret", "private", "auth", "signing", "encryption", "ssh"})
# Last-two-word names that are secrets though neither word is one alone (``session_id``, ``authorization_header``).
SECRET_PAIRS = frozenset({("session", "id"), ("auth", "header"), ("authorization", "header")})
# Query and fragment parameters that carry a secret under a one-word name (``?key=``, ``?sig=``); as mapping keys
# these words name columns (``key``), so they count only in a URL.
SECRET_PARAMS = frozenset({"key", "apikey", "sig", "signature"})
SPECIAL_TOKENS = frozenset({"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token"})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"<>]*")
# scheme://USERINFO@ : user:password up to the last '@' of the URL (a password may hold '@', '/', '?', '#', "'"),
# or, without a ':', a user name up to the last '@' before the path, query or fragment. An '@' in a path after a
# plain host (``http://docs/x@y``) is not user-info; after ``host:port/`` it is taken for one (hidden needlessly).
_USERINFO = re.compile(r"^(?P<scheme>[^:]+://)(?P<userinfo>[^/?#:@]*:\S*|[^/?#]+)@")
_BEARER = re.compile(r"(?i)\b(?P<kind>bearer)\s+[A-Za-z0-9._~+/=:-]{8,}|\b(?P<basic>basic)\s+(?=[A-Za-z+/]*\d)"
                     r"[A-Za-z0-9+/]{16,}={0,2}")
_PARAM = re.compile(r"(?P<sep>[?&;#])(?P<name>[^=&;#?]+)=(?P<value>[^&;#]*)")


def _words(key: str) -> list[str]:
    return _CAMEL.sub("_", key).lower().replace("-", "_").replace(".", "_").split("_")


def is_secret_key(key: Any) -> bool:
    """Whether ``key`` (a mapping key or field name) names a secret by the module's rule; False for a non-string."""
    if not isinstance(key, str):
        return False
    words = [w for w in _words(key) if w]
    if not words or "_".join(words) in SPECIAL_TOKENS:
        return False
    if words[-1] in SECRET_WORDS:
        return True
    if len(words) >= 2 and ((words[-1] in ("key", "keys") and words[-2] in SECRET_KEY_KINDS)
                            or tuple(words[-2:]) in SECRET_PAIRS):
        return True
    return any(a == "private" and b == "key" for a, b in zip(words, words[1:]))  # private_key_pem, ..._path


def _nothing_to_hide(key: str, value: Any) -> bool:
    return value is None or isinstance(value, bool) or (
        isinstance(value, str) and value in ("", REDACTED, f"<{key.upper()}>"))


def _secret_param(name: str) -> bool:
    return is_secret_key(name) or name.lower().replace("-", "_") in SECRET_PARAMS


def redact_url(text: str) -> str:
    """``text`` with every URL in it redacted -- its user-info and its secret-named query/fragment values become
    ``***`` -- and every ``Bearer <token>`` (or base64 ``Basic`` credential) of an HTTP header written into it. Text
    around them, and URLs with nothing to hide, are returned unchanged."""
    if "://" in text:
        def one_url(match: re.Match) -> str:
            url = _USERINFO.sub(lambda m: f"{m['scheme']}{URL_REDACTED}@", match.group(0), count=1)
            return _PARAM.sub(lambda m: (f"{m['sep']}{m['name']}={URL_REDACTED}" if _secret_param(m["name"])
                                         and m["value"] else m.group(0)), url)

        text = _URL.sub(one_url, text)
    if "earer" in text or "asic" in text:
        text = _BEARER.sub(lambda m: f"{m['kind'] or m['basic']} {URL_REDACTED}", text)
    return text


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with its secrets hidden: the value of a flag whose name is a secret by the rule
    (``--hub_token X``, ``--hf-token=X``, ``--api-key X``) becomes :data:`REDACTED`, and every argument gets
    :func:`redact_url`; an argument that is one URL is read whole (a password holding spaces stays in it)."""
    out, hide_next = [], False
    for arg in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.lstrip("-").partition("=")
            if is_secret_key(name):
                out.append(f"{arg.split('=', 1)[0]}={REDACTED}" if eq and value else arg)
                hide_next = not eq
                continue
        whole = re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^@]*:.*@", arg)
        out.append(f"{arg.split('://', 1)[0]}://{URL_REDACTED}@{arg.rsplit('@', 1)[1]}" if whole
                   else redact_url(arg))
    return out


def redact(value: Any, key: Any = None) -> Any:
    """``value`` (found under ``key``, if any) with every secret replaced by the rule of this module.

    Mappings, lists and tuples are copied (as a dict, a list, a plain tuple) and walked at every depth, each item
    checked under its own key; strings get :func:`redact_url`; any other value is returned as it is (the same
    object). The input is never modified."""
    if key is not None and is_secret_key(key) and not _nothing_to_hide(key, value):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, Mapping):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    return value


def redacted_copy(obj: Any) -> Any:
    """A shallow copy of the dataclass instance ``obj`` (e.g. a ``WinnowConfig``) whose fields hold :func:`redact`'s
    values, each under its field name; ``obj`` itself is not modified. The copy is made without running
    ``__post_init__``, so it is the same configuration as ``obj`` but for the secrets."""
    clone = copy.copy(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        redacted = redact(value, f.name)
        if redacted is not value:
            vars(clone)[f.name] = redacted
    return clone


def without_placeholders(value: Any) -> tuple[Any, list[str]]:
    """``value`` with every mapping entry whose value is :data:`REDACTED` removed (at any depth), and the dotted
    paths of the removed entries: what a re-run of a redacted recipe does with a placeholder, so that the library
    reads the secret from the environment instead of sending the placeholder."""
    dropped: list[str] = []

    def walk(v: Any, path: str) -> Any:
        if isinstance(v, Mapping):
            out = {}
            for k, item in v.items():
                where = f"{path}.{k}" if path else str(k)
                if isinstance(item, str) and item == REDACTED:
                    dropped.append(where)
                else:
                    out[k] = walk(item, where)
            return out
        if isinstance(v, list):
            return [walk(item, f"{path}[{i}]") for i, item in enumerate(v)]
        return v

    cleaned = walk(value, "")
    return (cleaned if dropped else value), dropped
