import pytest
import torch
import torch.nn.functional as F

from qkv.evaluation.losses import label_smoothed_nll, masked_nll

PAD = 0


def _batch(seed=0, B=3, T=7, V=13):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 3
    targets = torch.randint(1, V, (B, T), generator=g)
    targets[0, 4:] = PAD
    targets[2, 1:] = PAD
    return logits, targets


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_f_cross_entropy_with_label_smoothing(eps):
    logits, targets = _batch()
    x1 = logits.clone().requires_grad_(True)
    x2 = logits.clone().requires_grad_(True)
    out = label_smoothed_nll(x1, targets, smoothing=eps, ignore_index=PAD)
    ref = F.cross_entropy(x2.reshape(-1, x2.size(-1)), targets.reshape(-1), label_smoothing=eps, ignore_index=PAD)
    torch.testing.assert_close(out.loss, ref)
    out.loss.backward()
    ref.backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_returns_plain_nll_and_token_count():
    logits, targets = _batch()
    out = label_smoothed_nll(logits, targets, smoothing=0.1, ignore_index=PAD)
    plain = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=PAD)
    torch.testing.assert_close(out.nll, plain)
    assert not out.nll.requires_grad
    assert int(out.n_tokens) == int((targets != PAD).sum()) == 7 + 4 + 1
    zero = label_smoothed_nll(logits, targets, smoothing=0.0, ignore_index=PAD)
    torch.testing.assert_close(zero.loss, zero.nll)


def test_padding_does_not_count():
    logits, targets = _batch()
    out = label_smoothed_nll(logits, targets, ignore_index=PAD)
    changed = logits.clone()
    changed[targets == PAD] = 1000.0 * torch.randn_like(changed[targets == PAD])
    torch.testing.assert_close(label_smoothed_nll(changed, targets, ignore_index=PAD).loss, out.loss)


def test_all_ignored_gives_zero_not_nan():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    out = label_smoothed_nll(logits, torch.full((2, 3), PAD), ignore_index=PAD)
    assert out.loss.item() == 0.0 and int(out.n_tokens) == 0
    out.loss.backward()
    assert torch.all(logits.grad == 0)


def test_low_precision_logits_are_computed_in_float32():
    logits, targets = _batch()
    out = label_smoothed_nll(logits.bfloat16(), targets, ignore_index=PAD)
    assert out.loss.dtype == torch.float32
    ref = label_smoothed_nll(logits.bfloat16().float(), targets, ignore_index=PAD)
    torch.testing.assert_close(out.loss, ref.loss)


def test_shape_and_smoothing_errors():
    with pytest.raises(ValueError, match="do not match"):
        label_smoothed_nll(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_nll(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), smoothing=1.0)


def test_masked_nll_is_mean_over_response_tokens_only():
    logits, targets = _batch()
    mask = torch.zeros_like(targets, dtype=torch.bool)
    mask[0, 2:5] = True
    mask[1, 6] = True
    x = logits.clone().requires_grad_(True)
    out = masked_nll(x, targets, mask)
    logp = logits.log_softmax(-1)
    manual = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[mask].mean()
    torch.testing.assert_close(out.loss, manual)
    assert int(out.n_tokens) == 4
    out.loss.backward()
    assert torch.all(x.grad[~mask] == 0) and torch.any(x.grad[mask] != 0)
    with pytest.raises(TypeError, match="bool"):
        masked_nll(logits, targets, mask.long())


def test_the_written_gradient_passes_gradcheck():
    # The loss's backward pass is written by hand (p - q): checked against finite differences in
    # float64, with ignored rows, for the plain and the smoothed loss.
    from qkv.evaluation.losses import _SmoothedCrossEntropy

    logits, targets = _batch(V=6)
    scores = logits.reshape(-1, 6).double().requires_grad_(True)
    flat = targets.reshape(-1)
    for eps in (0.0, 0.2):
        assert torch.autograd.gradcheck(lambda s: _SmoothedCrossEntropy.apply(s, flat, flat != PAD, eps)[0], (scores,))


def test_a_second_backward_gives_the_same_gradient():
    logits, targets = _batch()
    x = logits.clone().requires_grad_(True)
    out = label_smoothed_nll(x, targets, smoothing=0.1, ignore_index=PAD)
    out.loss.backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    out.loss.backward()
    torch.testing.assert_close(x.grad, first, rtol=0, atol=0)


def test_scores_of_ignored_rows_never_reach_the_loss_or_the_gradient():
    logits, targets = _batch()
    reference = label_smoothed_nll(logits, targets, smoothing=0.1, ignore_index=PAD)
    poisoned = logits.clone()
    poisoned[targets == PAD] = float("inf")
    x = poisoned.requires_grad_(True)
    out = label_smoothed_nll(x, targets, smoothing=0.1, ignore_index=PAD)
    torch.testing.assert_close(out.loss, reference.loss)
    torch.testing.assert_close(out.nll, reference.nll)
    out.loss.backward()
    assert torch.all(x.grad[targets == PAD] == 0) and torch.isfinite(x.grad).all()
