"""benchmarks/sim_equivalence.py records two fingerprints as the same only when every case agrees."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(monkeypatch, tmp_path, old_cases, new_cases):
    spec = importlib.util.spec_from_file_location("sim_equivalence", os.path.join(ROOT, "benchmarks", "sim_equivalence.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ledger = tmp_path / "equivalent.json"
    monkeypatch.setattr(tool, "LEDGER", ledger)
    outs = {"old": {"fingerprint": "a" * 12, "cases": old_cases}, "new": {"fingerprint": "b" * 12, "cases": new_cases}}
    monkeypatch.setattr(tool, "battery", lambda root: "old" if root.name == "other" else "new")
    monkeypatch.setattr(tool, "collect", lambda proc, root: outs[proc])
    (tmp_path / "other" / "asap").mkdir(parents=True, exist_ok=True)
    return tool, ledger, str(tmp_path / "other")


def test_a_pair_is_recorded_once_and_only_when_every_case_agrees(monkeypatch, tmp_path, capsys):
    tool, ledger, other = _tool(monkeypatch, tmp_path, {"x": "1", "y": "2"}, {"x": "1", "y": "3"})
    assert tool.main(["--against", other, "--record"]) == 1
    assert not ledger.exists() and "DIFFERENT y" in capsys.readouterr().out

    tool, ledger, other = _tool(monkeypatch, tmp_path, {"x": "1", "y": "2"}, {"x": "1", "y": "2"})
    assert tool.main(["--against", other]) == 0 and not ledger.exists()      # no --record: nothing written
    assert tool.main(["--against", other, "--record"]) == 0
    assert [(e["from"], e["to"], e["cases"]) for e in json.loads(ledger.read_text())] == [("a" * 12, "b" * 12, 2)]
    assert tool.main(["--against", other, "--record"]) == 0                 # again: not twice
    assert len(json.loads(ledger.read_text())) == 1 and "already" in capsys.readouterr().out
