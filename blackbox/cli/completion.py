"""Print a shell completion script for blackbox: bash, zsh or fish (eval it, or save it where your shell
loads completions)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator, Sequence

from ._common import standalone

SHELLS = ("bash", "zsh", "fish")
FOLDER_METAVARS = {"DIR", "OUT"}  # values completed as folders; FILE and the positional targets as any path
VALUE_FREE = {"SECONDS", "N", "SIZE", "SIG", "LEVELS"}  # values no path completes
FISH_FOLDERS = "-x -a '(__fish_complete_directories (commandline -ct))'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")


def run(args: argparse.Namespace) -> int:
    from . import build_parser

    sys.stdout.write(completion_script(build_parser(), args.shell))
    return 0


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> Iterator[tuple[list[str], argparse.Action]]:
    for action in parser._actions:
        if action.option_strings:
            yield list(action.option_strings), action


def _value_words(action: argparse.Action) -> str:
    """How a value is completed in bash: ``-W words``, ``-d`` (folders), ``-f`` (paths) or nothing."""
    if action.choices:
        return "-W " + shlex.quote(" ".join(map(str, action.choices)))
    metavar = str(action.metavar or "")
    if metavar in FOLDER_METAVARS:
        return "-d"
    return "" if metavar in VALUE_FREE else "-f"


def bash_script(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    top = [w for words, _ in _options(parser) for w in words]
    cases = []
    for name, sub in commands.items():
        options = list(_options(sub))
        valued = [(words, _value_words(a)) for words, a in options if a.nargs != 0]
        prev = "".join(f"            {'|'.join(words)}) {_reply(how)}; return;;\n" for words, how in valued)
        flags = " ".join(w for words, _ in options for w in words)
        positional = next((a for a in sub._actions if not a.option_strings), None)
        rest = _reply(_value_words(positional)) if positional is not None and positional.nargs != 0 else "COMPREPLY=()"
        cases.append(
            f"        {name})\n"
            + (f'            case "$prev" in\n{prev}            esac\n' if prev else "")
            + f'            if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W {shlex.quote(flags)} -- "$cur")); '
            f"return; fi\n            {rest};;\n"
        )
    return f"""# bash completion for blackbox (`blackbox completion bash`): eval "$(blackbox completion bash)"
_blackbox() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *) cmd="${{COMP_WORDS[i]}}"; break;; esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W {shlex.quote(" ".join([*commands, *top]))} -- "$cur"))
        return
    fi
    case "$cmd" in
{"".join(cases)}    esac
}}
complete -o filenames -F _blackbox blackbox
"""


def _reply(how: str) -> str:
    return f'COMPREPLY=($(compgen {how} -- "$cur"))' if how else "COMPREPLY=()"


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return ("#compdef blackbox\n# zsh completion for blackbox (`blackbox completion zsh`): zsh runs the bash "
            "completion through bashcompinit\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash_script(parser))  # fmt: skip


def fish_script(parser: argparse.ArgumentParser) -> str:
    lines = ["# fish completion for blackbox (`blackbox completion fish`): blackbox completion fish | source",
             "complete -c blackbox -f"]  # fmt: skip
    commands = _commands(parser)
    for name, sub in commands.items():
        lines.append(f"complete -c blackbox -n __fish_use_subcommand -a {name} -d {_fish_quote(sub.description or '')}")
        for words, action in _options(sub):
            flags = " ".join(f"-s {w[1:]}" if len(w) == 2 else f"-l {w[2:]}" for w in words)
            value = ""
            if action.nargs != 0:
                how = _value_words(action)
                if action.choices:
                    value = f" -x -a {_fish_quote(' '.join(map(str, action.choices)))}"
                else:
                    value = {"-f": " -r -F", "-d": f" -r {FISH_FOLDERS}"}.get(how, " -x")
            lines.append(f"complete -c blackbox -n '__fish_seen_subcommand_from {name}' {flags}{value} "
                         f"-d {_fish_quote(action.help or '')}")  # fmt: skip
        positional = next((a for a in sub._actions if not a.option_strings), None)
        if positional is not None and positional.choices:
            lines.append(f"complete -c blackbox -n '__fish_seen_subcommand_from {name}' -a "
                         f"{_fish_quote(' '.join(map(str, positional.choices)))}")  # fmt: skip
        elif positional is not None:
            paths = FISH_FOLDERS if _value_words(positional) == "-d" else "-F"
            lines.append(f"complete -c blackbox -n '__fish_seen_subcommand_from {name}' {paths}")
    return "\n".join(lines) + "\n"


def _fish_quote(text: str) -> str:
    return "'" + " ".join(text.split())[:120].replace("\\", "\\\\").replace("'", "\\'") + "'"


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` (blackbox's) for ``shell``."""
    return {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[shell](parser)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox completion", argv)
