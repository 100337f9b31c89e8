"""`asap profile`: fits reproduce the samples they came from, and the profile it writes is what
get_hardware("cpu") loads from then on."""
import json

import pytest

from asap.config import ModelConfig
from asap.model.presets import preset_config
from asap.studies.calibrate import fit_op_rate
from asap.sim.cost import CostModel
from asap.sim.hardware import OP_NAMES, PROFILE_DIR, OpRate, cpu_profile_path, from_json, get_hardware
from asap.studies.profile import TINY, OpFit, profile


def _samples(rate: OpRate, sizes=(1e6, 1e7, 1e8, 1e9)):
    # FLOPs and bytes grow at different paces, so both terms are identifiable
    return [(f"s{i}", f, 3e5 * f ** 0.5, rate.seconds(f, 3e5 * f ** 0.5), rate.seconds(f, 3e5 * f ** 0.5))
            for i, f in enumerate(sizes)]


@pytest.mark.parametrize("true", [OpRate(5e10, 2e9, 2e-4, overlap=False), OpRate(8e10, 1e30, 5e-5)])
def test_fit_reproduces_synthetic_samples(true):
    fit = OpFit.of(_samples(true))
    assert fit.rate.overlap == true.overlap             # the sum form is kept only when both terms count
    assert fit.error() < 1e-6
    for _, f, b, s, _ in _samples(true, sizes=(3e6, 3e8)):      # also between and beyond the samples
        assert fit.fitted(f, b) == pytest.approx(s, rel=1e-6)


def test_fit_op_rate_weights_are_checked():
    samples = [(1e6, 1.0, 1e-3), (2e6, 1.0, 2e-3), (4e6, 1.0, 4e-3)]
    assert fit_op_rate(samples, weights=[1e3, 5e2, 2.5e2]).flops_per_s == pytest.approx(1e9, rel=1e-6)
    with pytest.raises(ValueError, match="weights"):
        fit_op_rate(samples, weights=[1.0, 0.0, 1.0])


def test_sum_form_survives_json_and_the_cost_model():
    hw = get_hardware(PROFILE_DIR / "cpu.json")
    d = hw.to_json()
    d["ops"]["attn_core"]["overlap"] = False
    loaded = from_json(json.loads(json.dumps(d)))
    cost = CostModel(ModelConfig.from_hf(preset_config("tiny-deepseek-v3")), loaded)
    r = cost.rates["attn_core"]
    assert not r.overlap and r.seconds(1e9, 1e9) == pytest.approx(r.overhead_s + 1e9 / r.flops_per_s
                                                                    + 1e9 / r.bytes_per_s)


def test_profile_writes_the_cpu_profile_get_hardware_loads(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setenv("ASAP_CACHE", str(tmp_path))
    shipped = get_hardware("cpu")
    assert cpu_profile_path() == PROFILE_DIR / "cpu.json" and not shipped.calibrated
    hw, report, path = profile(tiny_dirs["tiny-deepseek-v3"], sizes=TINY, log=lambda *a: None)
    assert path == tmp_path / "profiles" / "cpu.json" == cpu_profile_path()
    loaded = get_hardware("cpu")
    assert loaded.calibrated and "asap profile" in loaded.source
    assert loaded.ops == hw.ops and loaded.link == hw.link
    assert loaded.weight_bytes == 4 and loaded.gemm_tile_m == 1          # float32 weights, no GEMM tiles on CPU
    assert set(report["ops"]) == set(OP_NAMES)
    for op in OP_NAMES:
        for s in report["ops"][op]["samples"]:
            assert s["measured_s"] >= 0 and s["fitted_s"] == pytest.approx(loaded.ops[op].seconds(s["flops"],
                                                                                                  s["bytes"]))
    assert report["stages"] and all(s["measured_s"] > 0 and s["predicted_s"] > 0 for s in report["stages"])
    assert 0 < loaded.link.latency_s < 1 and loaded.link.intra_bytes_per_s > 0


def test_profile_cli_rejects_bad_threads(capsys):
    from asap.cli import main
    assert main(["profile", "--threads", "0"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err


def test_sim_cli_offers_every_simulator_command():
    from asap.cli import build_parser
    p = build_parser()
    for cmd in ("headline", "calibrate", "speed", "trace", "validate"):
        assert p.parse_args(["sim", cmd]).cmd == cmd
    a = p.parse_args(["profile", "--model", "tiny-deepseek-v3", "--out", "x.json", "--statistic", "median"])
    assert (a.model, a.out, a.threads, a.statistic) == ("tiny-deepseek-v3", "x.json", 1, "median")


def test_headline_and_plan_vet_by_default_under_sustained(monkeypatch, tmp_path):
    """--sustained alone vets (the rule the README's table is made by); --no-vet gives the older rule; without
    --sustained nothing is vetted. The same for `asap sim headline` and `asap plan --tune`."""
    import asap.bench.plan_cli as plan_cli
    import asap.studies.__main__ as sim_main
    import asap.studies.plan as plan_mod
    from asap.cli import main
    seen = []
    monkeypatch.setattr(sim_main, "run_headline", lambda *a, **kw: seen.append((kw["sustained"], kw["vet"])))

    def fake_best_configs(*a, **kw):
        seen.append((kw["sustained"], kw["vet"]))
        raise SystemExit(0)
    monkeypatch.setattr(plan_mod, "best_configs", fake_best_configs)
    head = ["sim", "headline", "--devices", "32", "--workloads", "fixed-4k", "--out", str(tmp_path)]
    plan = ["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "5s"]
    for argv in (head, plan):
        for extra, want in (([], (False, False)), (["--sustained"], (True, True)),
                            (["--sustained", "--no-vet"], (True, False)), (["--sustained", "--vet"], (True, True))):
            seen.clear()
            try:
                main(argv + extra)
            except SystemExit:
                pass
            assert seen == [want], (argv, extra)


@pytest.mark.parametrize("argv, says", [
    (["sim", "headline", "--devices", "0", "--workloads", "fixed-4k"], "distinct device counts >= 2"),
    (["sim", "headline", "--devices", "32", "32", "--workloads", "fixed-4k"], "distinct device counts >= 2"),
    (["sim", "headline", "--devices", "32", "--workloads", "fixed-4k", "--out", "/proc/asap-no-such"],
     "cannot write there"),
    (["sim", "headline", "--devices", "32", "--workloads", "fixed-4k", "--num-requests", "1"], "--num-requests must be >= 2"),
    (["sim", "headline", "--devices", "32", "--workloads", "fixed-4k", "--vet"], "give --sustained too"),
    (["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "2s+1ms/tok", "--num-requests", "0"],
     "--num-requests must be >= 2"),
    (["sim", "trace", "--rate", "0"], "--rate > 0"),
    (["sim", "trace", "--start", "-5"], "--start >= 0"),
    (["sim", "trace", "--length", "0"], "--length > 0"),
])
def test_sim_cli_refuses_bad_arguments_before_simulating(argv, says, capsys):
    """One line and exit 2, before any simulation (a headline would otherwise tune for minutes first)."""
    from asap.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
