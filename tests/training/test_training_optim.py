import pytest
import torch

from qkv.training.optim import build_adam, build_adamw, decay_param_names


def _ids(opt):
    return [id(p) for g in opt.param_groups for p in g["params"]]


def test_adam_has_the_papers_hyperparameters_and_each_param_once(make_model):
    model = make_model(tied=True)
    opt = build_adam(model, lr=1e-3)
    g = opt.param_groups[0]
    assert g["betas"] == (0.9, 0.98) and g["eps"] == 1e-9 and g["weight_decay"] == 0.0
    ids = _ids(opt)
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}
    # the tied embedding/head is one tensor: 5 tensors (emb, proj.w, proj.b, norm.w, norm.b)
    assert len(ids) == 5


def test_adamw_decays_matrices_and_embeddings_only(make_model):
    model = make_model(tied=True)
    decay, no_decay = decay_param_names(model)
    assert sorted(decay) == ["emb.weight", "proj.weight"]
    assert sorted(no_decay) == ["norm.bias", "norm.weight", "proj.bias"]
    opt = build_adamw(model, lr=1e-3, weight_decay=0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(model.emb.weight), id(model.proj.weight)}
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_adamw_weight_decay_acts_only_on_the_decayed_group(make_model):
    model = make_model(tied=False)
    lr, wd = 0.1, 0.5
    opt = build_adamw(model, lr=lr, weight_decay=wd)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # zero gradient: only decoupled decay can move a weight
    opt.step()
    for n, p in model.named_parameters():
        if p.dim() >= 2:
            torch.testing.assert_close(p.detach(), before[n] * (1 - lr * wd))
        else:
            torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0)


def test_fused_on_cpu_by_default_and_foreach_on_request(make_model):
    model = make_model()
    assert build_adamw(model, lr=1e-3).defaults["fused"] is True
    assert build_adam(model, lr=1e-3).defaults["fused"] is True
    opt = build_adamw(model, lr=1e-3, fused=False)
    assert not opt.defaults["fused"]
    # fused and foreach take the same step
    m1, m2 = make_model(seed=3), make_model(seed=3)
    o1, o2 = build_adamw(m1, lr=1e-2), build_adamw(m2, lr=1e-2, fused=False)
    ids = torch.randint(0, 11, (2, 5))
    for m, o in ((m1, o1), (m2, o2)):
        m(ids).sum().backward()
        o.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2)


def test_frozen_parameters_are_left_out(make_model):
    model = make_model()
    for p in model.parameters():
        p.requires_grad_(False)
    model.proj.weight.requires_grad_(True)
    opt = build_adamw(model, lr=1e-3)
    assert _ids(opt) == [id(model.proj.weight)]
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_adam(model, lr=1e-3)
