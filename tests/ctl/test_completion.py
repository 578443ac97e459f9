"""`effectd completion bash|zsh` (issue 25 item 12): a completion script
made by shtab from the command's own parsers, so a new command or flag
completes without anyone editing a script."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sidecar.cli import main


def _script(shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the last of `words`, as a user's TAB would."""
    line = " ".join(words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
        f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}\n'
        "_shtab_effectd\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return sorted(done.stdout.split())


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (("effectd", "c"), ["completion", "console", "ctl"]),
        (("effectd", "ctl", "re"), ["reconcile", "recover", "reject", "restore"]),
        (("effectd", "ctl", "audit", ""), ["list", "verify"]),
        (("effectd", "ctl", "list", "--o"), ["--older-than"]),
        (("effectd", "ctl", "list", "--js"), ["--json"]),
        (("effectd", "serve", "--data"), ["--data-dir"]),
    ],
)
def test_bash_completes_commands_and_flags(
    words: tuple[str, ...],
    offered: list[str],
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sourced in bash, the script completes `effectd` and `effectd ctl`
    commands, subcommands and flags (fails before the fix: no `completion`
    command)."""
    script = short_tmp / "effectd.bash"
    script.write_text(_script("bash", capsys))
    assert _complete(script, *words) == offered


def test_zsh_gets_a_compdef_of_every_ctl_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The zsh script is a `#compdef effectd` function with the options of
    each command."""
    script = _script("zsh", capsys)
    assert script.startswith("#compdef effectd")
    for command in ("list", "show", "approve", "enter_reconciliation", "restore"):
        assert f"_shtab_effectd_ctl_{command}_options=(" in script, command
    assert '"--older-than[' in script


def test_an_unknown_shell_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["completion", "fish"])
    assert info.value.code == 2
