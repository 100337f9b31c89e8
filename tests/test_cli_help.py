"""Promise of the `asap` command's help: every command and sub-command has a description, every flag has
help, no default prints twice, and `asap --version` names the installed distribution's version."""
import argparse
from importlib.metadata import version

import pytest

from asap.cli import build_parser, commands, main


ALL = list(commands(build_parser()))


def test_every_command_is_listed_with_a_description():
    names = {n for n, _ in ALL}
    for cmd in ("bench", "demo", "serve", "plan", "ablation", "make-model", "profile", "expert-worker",
                "sim", "sim headline", "sim calibrate", "sim speed", "sim trace", "sim validate"):
        assert f"asap {cmd}" in names, cmd
    for name, p in ALL:
        assert p.description and p.description.strip(), f"{name}: no description"


@pytest.mark.parametrize("name, p", ALL, ids=[n for n, _ in ALL])
def test_every_flag_has_help_and_at_most_one_default(name, p):
    formatter = p._get_formatter()
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction) or a.help == argparse.SUPPRESS:
            continue
        assert a.help, f"{name} {'/'.join(a.option_strings) or a.dest}: no help"
        text = formatter._expand_help(a)
        assert text.count("(default") <= 1, f"{name} {'/'.join(a.option_strings)}: {text}"


def test_defaults_are_shown():
    help_text = dict(ALL)["asap bench"].format_help()
    assert "(default: /v1/completions)" in help_text and "(default: 100)" in help_text


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"asap {version('asap-prefill')} (asap-prefill)"
