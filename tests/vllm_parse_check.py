"""Run by the vLLM server's interpreter (tests/gpu/test_gpu_server_flags.py): parse launcher commands with vLLM's own
server argument parser. stdin: a JSON list of argv lists; stdout: a JSON list of null (accepted) or the error."""

import contextlib
import io
import json
import sys

from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def check(argv: list[str]) -> str | None:
    """None if vLLM's serve parser (the `vllm serve` subcommand's and the OpenAI module's) accepts the arguments."""
    rest = argv[argv.index("-m") + 2:]
    if argv[argv.index("-m") + 1] == "vllm.entrypoints.cli.main":
        if rest[:1] != ["serve"]:
            return f"not a serve command: {rest[:1]}"
        rest = rest[1:]
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(rest)
        validate_parsed_serve_args(args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "parser exited"
    except Exception as e:  # noqa: BLE001 - any validation error is the answer
        return f"{type(e).__name__}: {e}"
    return None


print(json.dumps([check(argv) for argv in json.load(sys.stdin)]))
