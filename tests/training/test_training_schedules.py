import math

import pytest
import torch

from qkv.training.schedules import cosine_lr, inverse_sqrt_lr, noam_lr, noam_peak_lr, set_lr


def test_noam_exact_values_of_equation_3():
    d, w = 512, 4000
    assert noam_lr(1, d, w) == pytest.approx(512**-0.5 * 1 * 4000**-1.5, rel=1e-12)
    assert noam_lr(100, d, w) == pytest.approx(512**-0.5 * 100 * 4000**-1.5, rel=1e-12)
    assert noam_lr(16000, d, w) == pytest.approx(512**-0.5 * 16000**-0.5, rel=1e-12)
    assert noam_lr(4000, d, w) == pytest.approx(7.0e-4, abs=1e-5)  # the paper's base-model peak
    assert noam_lr(16000, d, w, factor=2.0) == pytest.approx(2 * noam_lr(16000, d, w))


def test_noam_peaks_at_warmup_and_is_monotone_on_each_side():
    d, w = 64, 50
    lrs = [noam_lr(s, d, w) for s in range(1, 4 * w)]
    peak = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak == w
    assert lrs[w - 1] == pytest.approx(noam_peak_lr(d, w))
    assert all(a < b for a, b in zip(lrs[: w - 1], lrs[1:w]))
    assert all(a > b for a, b in zip(lrs[w - 1 : -1], lrs[w:]))


def test_inverse_sqrt_is_noam_rescaled_to_the_peak():
    d, w, peak = 256, 30, 1e-3
    assert inverse_sqrt_lr(w, w, peak) == pytest.approx(peak)
    assert max(inverse_sqrt_lr(s, w, peak) for s in range(1, 200)) == pytest.approx(peak)
    for s in (1, 7, 30, 31, 500):
        assert inverse_sqrt_lr(s, w, peak) == pytest.approx(noam_lr(s, d, w) / noam_peak_lr(d, w) * peak, rel=1e-12)
    assert inverse_sqrt_lr(4 * w, w, peak) == pytest.approx(peak / 2)


def test_cosine_warmup_peak_middle_and_end():
    mx, mn, w, total = 1e-3, 1e-4, 10, 110
    assert cosine_lr(1, mx, mn, w, total) == pytest.approx(mx / w)
    assert cosine_lr(w, mx, mn, w, total) == pytest.approx(mx)
    assert cosine_lr(60, mx, mn, w, total) == pytest.approx((mx + mn) / 2)
    assert cosine_lr(total, mx, mn, w, total) == pytest.approx(mn)
    assert cosine_lr(total + 1000, mx, mn, w, total) == mn
    decay = [cosine_lr(s, mx, mn, w, total) for s in range(w, total + 1)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    # no warmup: the decay starts at the maximum
    assert cosine_lr(1, mx, mn, 0, 100) == pytest.approx(mn + 0.5 * (1 + math.cos(math.pi / 100)) * (mx - mn))


@pytest.mark.parametrize(
    "call",
    [
        lambda: noam_lr(0, 512, 4000),
        lambda: inverse_sqrt_lr(0, 10, 1e-3),
        lambda: cosine_lr(0, 1.0, 0.0, 1, 10),
        lambda: cosine_lr(1, 1.0, 0.0, 10, 10),
        lambda: noam_lr(1, 512, 0),
    ],
)
def test_bad_arguments_are_errors(call):
    with pytest.raises(ValueError):
        call()


def test_set_lr_sets_every_group_with_optional_scale():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr_scale": 0.5}], lr=1.0)
    set_lr(opt, 0.2)
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.1]
