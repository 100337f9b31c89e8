"""linear_cost is a + b*sum(n) + c*sum(n*(ctx+n))."""
import pytest

from asap.scheduler import linear_cost


def test_linear_cost_formula():
    cost = linear_cost(0.5, 2.0, 3.0)
    assert cost([]) == 0.5
    assert cost([(4, 0), (2, 10)]) == pytest.approx(0.5 + 2.0 * 6 + 3.0 * (4 * 4 + 2 * 12))


def test_linear_cost_rejects_negative_coefficients():
    with pytest.raises(ValueError, match="coefficients"):
        linear_cost(0.0, -1.0, 0.0)
