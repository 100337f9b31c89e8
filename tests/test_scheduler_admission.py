"""SLO admission acts only when the predicted finish is past arrival + slack * SLO."""
import pytest

from asap.scheduler import DEMOTED_PRIORITY, Rejected, Request, SLOAdmission


def req(deadline=2.0):
    return Request(id=1, num_tokens=10, arrival=1.0, deadline=deadline)   # SLO budget 1 s (bound 3 s at slack 2)


def test_off_admits_everything():
    adm = SLOAdmission("off")
    assert adm.decide(req(), predicted_ttft=1e9, now=1.0).action == "admit"


@pytest.mark.parametrize("mode", ["reject", "demote"])
def test_acts_only_past_the_slack_bound(mode):
    adm = SLOAdmission(mode, slack=2.0)
    assert adm.decide(req(), predicted_ttft=1.5, now=1.5).action == "admit"     # finish 3.0 == bound
    late = adm.decide(req(), predicted_ttft=1.6, now=1.5)                       # finish 3.1 > 3.0
    assert late.action == mode and "3.100" in late.reason
    assert adm.decide(req(deadline=None), predicted_ttft=1e9, now=1.0).action == "admit"


def test_decide_is_pure_and_admit_applies_the_decision():
    r = req()
    SLOAdmission("demote").decide(r, predicted_ttft=10.0, now=1.0)
    assert r.priority == 0
    assert SLOAdmission("demote").admit(r, predicted_ttft=10.0, now=1.0).action == "demote"
    assert r.priority == DEMOTED_PRIORITY
    with pytest.raises(Rejected, match="request 1"):
        SLOAdmission("reject").admit(req(), predicted_ttft=10.0, now=1.0)


def test_bad_mode_and_slack():
    with pytest.raises(ValueError, match="off, reject, demote"):
        SLOAdmission("drop")
    with pytest.raises(ValueError, match="slack"):
        SLOAdmission("reject", slack=0)
