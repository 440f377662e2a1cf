"""``python -m enginesim <command>``.

To add a command, add ``name: "module.path"`` to COMMANDS; the module provides
``add_arguments(parser)`` and ``main(args) -> int`` and is imported only when used.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("enginesim.server.cli", "run simulated vLLM instances over HTTP"),
    "replay": ("enginesim.replay.cli", "replay a trace through routing policies in virtual time"),
    "capacity": (
        "enginesim.replay.capacity",
        "how many instances a trace needs to meet an SLO (replays over fleet sizes)",
    ),
    "loadgen": ("enginesim.loadgen.cli", "send a trace's requests to an OpenAI-compatible URL"),
}


def _load_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enginesim")
    subparsers = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if arg in COMMANDS), None)
    for name, (_, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        if name == chosen:  # import only the command being run
            _load_module(name).add_arguments(sub)
    args = parser.parse_args(argv)
    return _load_module(args.command).main(args)


if __name__ == "__main__":
    sys.exit(main())
