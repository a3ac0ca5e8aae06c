"""The `memllm` command. Thin: every subcommand lives in its own module and is imported only when run,
so `memllm --help` never imports jax.

A subcommand module defines `add_arguments(parser: argparse.ArgumentParser)` and `main(args) -> int | None`.

Bad input fails like a CLI, for every command in one place (`_input_error`): one line
`error: <file>: <record/field>: <what>` on stderr and exit status 2; `memllm --debug COMMAND ...` shows the
traceback instead. See docs/errors.md.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("experiments.run", "run the embedded-default main job, an experiment config or a sweep"),
    "data": ("data_gen.cli", "synthesize corpora and build write / read / eval examples"),
    "train": ("experiments.train_cli", "pretrain or LoRA-finetune from an experiment config"),
    "memory": ("memllm_jax.memory.cli", "create, import, export, query and inspect a triple memory"),
    "generate": ("memllm_jax.decode.generate_cli", "generate text with memory reads"),
    "chat": ("memllm_jax.decode.chat_cli", "interactive chat with a persistent memory"),
    "eval": ("experiments.eval_cli", "Table 2 perplexity, Table 3 editing and scaling evaluations"),
    "convert": ("memllm_jax.model.convert_cli", "convert weights between HF directories and Orbax checkpoints"),
    "model-size": ("memllm_jax.model.size_cli", "parameter bytes in total and per device for a preset on a mesh"),
    "plan": ("memllm_jax.plan_cli", "AOT-compile the train and decode steps: per-device memory, FLOPs, fit"),
    "bench": ("memllm_jax.bench.cli", "benchmarks: model, memory, train, decode"),
    "report": ("experiments.report_markdown", "RESULTS.md from run directories: the latest tables of each config"),
}


INPUT_ERROR_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memllm", description="MemLLM in JAX: an LLM with an explicit triple memory.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _input_error(exc: BaseException) -> str | None:
    """The one-line message of an error caused by bad input, or None for anything else (a bug: traceback)."""
    import json

    from memllm_jax.errors import InputError

    if isinstance(exc, SystemExit):  # `raise SystemExit("message")` in a command: a refused input
        return exc.code if isinstance(exc.code, str) else None
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:  # missing file, a directory, no permission
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, FileNotFoundError):  # raised by a loader with a message naming the path
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):  # a loader that did not name its file (see memllm_jax.errors)
        return f"<unnamed input>: byte offset {exc.start}: not UTF-8 text ({exc.reason})"
    if isinstance(exc, json.JSONDecodeError):
        return f"<unnamed input>: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(argv) and argv[0] == "--debug"
    argv = argv[1:] if debug else argv
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints help or the "invalid choice" error
        build_parser().print_help()
        return 0 if not argv else 2
    try:
        return _run(argv[0], argv[1:])
    except (Exception, SystemExit) as exc:
        message = _input_error(exc)
        if message is None or debug:
            raise
        message = " ".join(message.split())  # one line
        print(message if message.startswith("error: ") else f"error: {message}", file=sys.stderr)
        return INPUT_ERROR_EXIT


SUBCOMMANDS: dict[tuple[str, str], tuple[str, str]] = {
    ("memory", "write"): ("memllm_jax.decode.write_cli", "write a corpus into a memory with the memory-write model"),
    ("memory", "merge"): ("memllm_jax.decode.merge_cli", "join the shards of a multi-process `memory write`"),
}
"""Subcommands living in a module other than their command's (so `memllm memory --help` never imports jax)."""


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none (None, an off flag) or the help names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _shows_default(action) and "(default" not in text:
            text += " (default: %(default)s)"
        return text


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return (bool(action.option_strings) and action.help is not argparse.SUPPRESS
            and not any(default is off for off in (None, False, argparse.SUPPRESS)) and default != [])


class CommandParser(argparse.ArgumentParser):
    """The parser of one command: its help shows defaults, and a refused argument is one line and exit 2 like
    any other input error (`--batch-size 0: must be a positive integer`; see memllm_jax/options.py)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.subcommands: argparse.Action | None = None

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and _shows_default(action):  # no help text: still say the default
            action.help = "(default: %(default)s)"
        return action

    def add_subparsers(self, **kwargs):
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands

    def error(self, message: str):
        refused = re.fullmatch(r"argument (\S+): (.*)", message, flags=re.S)  # argparse: "argument -b/--batch: ..."
        if refused and refused.group(1).startswith("-"):
            option, problem = refused.group(1).split("/")[-1], refused.group(2)
            # memllm_jax.options says "<value>: must be ...": "--batch-size 0: must be a positive integer"
            raise SystemExit(f"{option} {problem}" if ": must be " in problem else f"{option}: {problem}")
        if refused:  # a positional argument: its name is internal
            message = refused.group(2)
        raise SystemExit(f"{self.prog}: {message} (see {self.prog} --help)")


def _run(name: str, rest: list[str]) -> int:
    module_name, help_text = COMMANDS[name]
    if (name, rest[0] if rest else "") in SUBCOMMANDS:
        module_name, help_text = SUBCOMMANDS[(name, rest[0])]
        name, rest = f"{name} {rest[0]}", rest[1:]
    module = importlib.import_module(module_name)
    parser = CommandParser(prog=f"memllm {name}", description=help_text)
    module.add_arguments(parser)
    for (command, sub), (_, sub_help) in SUBCOMMANDS.items():  # listed in the command's help, run by their module
        if command == name and parser.subcommands is not None:
            parser.subcommands.add_parser(sub, help=sub_help, add_help=False)
    args = parser.parse_args(rest)
    result = module.main(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
