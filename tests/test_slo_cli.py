"""Promise: one SLO syntax (asap.workload.slo) on every command's --slo, and the removed spellings
(--slo-ttft-s, --slo-per-token-ms) refused with the --slo that replaces them."""

import pytest

from asap.cli import build_parser, commands
from asap.workload.slo import SLO, parse_slo


ALL = dict(commands(build_parser()))
# the arguments each command requires besides --slo
REQUIRED = {"asap bench": [], "asap plan": ["--devices", "4"], "asap ablation": [],
            "asap sim headline": [], "asap sim explain": ["--engine", "sync", "--rate", "1"]}
RELATIVE = {"asap plan", "asap ablation"}          # they know the model and cluster: "5x" resolves there


def with_slo():
    return {n for n, p in ALL.items() if any("--slo" in a.option_strings for a in p._actions)}


def test_these_commands_take_slo_and_no_other_slo_spelling_exists():
    assert with_slo() == set(REQUIRED)
    for name, p in ALL.items():
        flags = {s for a in p._actions for s in a.option_strings if "slo" in s}
        assert flags <= {"--slo", "--slo-ttft-s", "--slo-per-token-ms", "--slo-scales"}, (name, flags)
        if "--slo" in flags:
            assert {"--slo-ttft-s", "--slo-per-token-ms"} <= flags, name      # refused, not unknown


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_slo_flag_takes_the_one_syntax_with_one_meaning(name):
    p = ALL[name]
    for spec in ("5s", "5000ms", "ttft:5000", "2s+1ms/tok", "1ms/tok"):
        got = p.parse_args(REQUIRED[name] + ["--slo", spec]).slo
        assert parse_slo(got) == parse_slo(spec)
    assert parse_slo(p.parse_args(REQUIRED[name] + ["--slo", "2s+1ms/tok"]).slo) == SLO(2.0, 1e-3)
    assert SLO(2.0, 1e-3).budget(1000) == pytest.approx(3.0)                 # the sum, everywhere
    if name in RELATIVE:
        assert p.parse_args(REQUIRED[name] + ["--slo", "5x"]).slo == "5x"


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_bad_specs_and_old_spellings_are_refused_with_a_hint(name, capsys):
    p = ALL[name]
    bad = ["fast", "2s+3s"] + ([] if name in RELATIVE else ["5x"])
    for spec in bad:
        with pytest.raises(SystemExit):
            p.parse_args(REQUIRED[name] + ["--slo", spec])
        assert "SLO" in capsys.readouterr().err
    for old, value, hint in (("--slo-ttft-s", "10", "--slo 10s"), ("--slo-per-token-ms", "20", "--slo 20ms/tok")):
        with pytest.raises(SystemExit):
            p.parse_args(REQUIRED[name] + [old, value])
        err = capsys.readouterr().err
        assert f"{old} was removed" in err and hint in err and "sum" in err, err
