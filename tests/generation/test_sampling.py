import pytest
import torch

from qkv.generation.sampling import check_sampling_args, filter_logits, next_token


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert torch.isfinite(filter_logits(logits, top_p=0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.81)).tolist() == [[True, True, True, False]]
    # Order in the vocabulary does not matter.
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isfinite(filter_logits(shuffled, top_p=0.8)).tolist() == [[False, True, False, True]]


def test_greedy_and_seeded_sampling():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    assert next_token(logits, temperature=0).item() == 1
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = [next_token(logits, 1.0, generator=g1).item() for _ in range(20)]
    b = [next_token(logits, 1.0, generator=g2).item() for _ in range(20)]
    assert a == b and len(set(a)) > 1
    # top_k=1 is greedy whatever the temperature.
    assert all(next_token(logits, 5.0, top_k=1).item() == 1 for _ in range(10))


@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature=float("inf")),
                                dict(top_k=-1), dict(top_p=1.5), dict(top_p=0.0), dict(top_p=float("nan"))])
def test_invalid_settings(kw):
    args = dict(temperature=1.0, top_k=None, top_p=None) | kw
    with pytest.raises(ValueError):
        check_sampling_args(**args)
