import torch

from qkv.modules.packing import UNPACKED, Packing, packing_for


def test_pack_unpack_roundtrip_and_order():
    keep = torch.tensor([[True, True, False], [True, False, False]])
    p = Packing(keep)
    x = torch.arange(6.0).view(2, 3, 1).expand(2, 3, 4)
    packed = p.pack(x)
    assert p.n_tokens == 3 and packed.shape == (3, 4)
    torch.testing.assert_close(packed, x[keep])  # row-major, as boolean indexing
    back = p.unpack(packed)
    torch.testing.assert_close(back[keep], x[keep])
    assert bool((back[~keep] == 0).all())


def test_gradients_flow_through_packing():
    keep = torch.tensor([[True, False], [True, True]])
    p = Packing(keep)
    x = torch.randn(2, 2, 3, requires_grad=True)
    p.unpack(p.pack(x) * 2).sum().backward()
    assert torch.equal(x.grad[keep], torch.full((3, 3), 2.0))
    assert torch.equal(x.grad[~keep], torch.zeros(1, 3))


def test_no_padding_no_packing():
    x = torch.randn(2, 2, 3)
    unpacked = packing_for(torch.tensor([[4, 5], [6, 7]]), pad_id=0)
    assert unpacked is UNPACKED and not unpacked.packs
    assert unpacked.pack(x) is x and unpacked.unpack(x) is x  # the layout of an unpadded batch lays out nothing
    assert packing_for(torch.tensor([[4, 0], [6, 7]]), pad_id=0).n_tokens == 3
