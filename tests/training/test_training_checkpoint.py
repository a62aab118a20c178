import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import qkv.files
import qkv.training.checkpoint as ckpt
from qkv.training.checkpoint import capture_rng_state, list_checkpoints, load_checkpoint, restore_rng_state, save_checkpoint
from qkv.weights import CheckpointError, average_checkpoints, load_state_dict_into, load_weights, save_weights
from qkv.training.optim import build_adam


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _no_temp_files(directory):
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name]


def test_weights_round_trip_keeps_the_tie(tmp_path, make_model):
    src = make_model(seed=1, tied=True)
    path = save_weights(tmp_path / "model.safetensors", src)
    assert len(load_file(path)) == len(src.state_dict()) - 1  # the tied tensor is stored once
    dst = make_model(seed=2, tied=True)
    assert load_weights(path, dst) == ([], [])
    _assert_same_weights(src, dst)
    assert dst.head.weight is dst.emb.weight
    with torch.no_grad():
        dst.emb.weight[0, 0] = 123.0
    assert dst.head.weight[0, 0] == 123.0


def test_load_errors_list_missing_unexpected_and_shapes(tmp_path, make_model):
    path = save_weights(tmp_path / "small.safetensors", make_model(d=8, tied=True))
    bigger = make_model(d=16, tied=False)
    bigger.extra = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError) as err:
        load_weights(path, bigger)
    msg = str(err.value)
    assert str(path) in msg
    assert "missing keys" in msg and "extra.weight" in msg and "extra.bias" in msg
    assert "shape mismatches" in msg and "proj.weight: file (8, 8) vs model (16, 16)" in msg
    # An untied model lacks head.weight in a tied file; a model lacking a layer sees unexpected keys.
    untied = make_model(d=8, tied=False)
    with pytest.raises(CheckpointError, match="missing keys.*head.weight"):
        load_weights(path, untied)
    missing, unexpected = load_weights(path, untied, strict=False)
    assert missing == ["head.weight"] and unexpected == []
    smaller = make_model(d=8, tied=True)
    del smaller.proj
    with pytest.raises(CheckpointError, match="unexpected keys.*proj.bias, proj.weight"):
        load_weights(path, smaller)


def test_untied_file_with_different_tensors_refuses_a_tied_model(tmp_path, make_model):
    path = save_weights(tmp_path / "untied.safetensors", make_model(tied=False))
    with pytest.raises(CheckpointError, match="tied in the model but differ"):
        load_weights(path, make_model(tied=True))


def test_missing_or_corrupt_weights_file(tmp_path, make_model):
    with pytest.raises(CheckpointError, match="no such weights file"):
        load_weights(tmp_path / "nope.safetensors", make_model())
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_weights(bad, make_model())


def test_average_of_two_known_weight_sets(tmp_path, make_model):
    a, b = make_model(tied=True), make_model(tied=True)
    a.register_buffer("count", torch.tensor([7]))
    b.register_buffer("count", torch.tensor([7]))
    with torch.no_grad():
        for p in a.parameters():
            p.fill_(1.0)
        for i, p in enumerate(b.parameters()):
            p.fill_(float(i) + 3.0)
    pa, pb = save_weights(tmp_path / "a.safetensors", a), save_weights(tmp_path / "b.safetensors", b)
    avg = average_checkpoints([pa, pb])
    target = make_model(seed=5, tied=True)
    target.register_buffer("count", torch.tensor([0]))
    load_state_dict_into(target, avg)
    for i, p in enumerate(target.parameters()):
        assert torch.all(p == (1.0 + i + 3.0) / 2)
    assert target.count.item() == 7
    assert target.head.weight is target.emb.weight
    # a file from another model cannot be averaged in
    pc = save_weights(tmp_path / "c.safetensors", make_model(d=4))
    with pytest.raises(CheckpointError, match="c.safetensors"):
        average_checkpoints([pa, pc])


def test_rng_state_round_trip_through_weights_only_load():
    state = capture_rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    draws = (torch.rand(3), random.random(), np.random.rand(2))
    buf.seek(0)
    restore_rng_state(torch.load(buf, weights_only=True))
    again = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(draws[0], again[0]) and draws[1] == again[1] and np.array_equal(draws[2], again[2])


def test_checkpoint_round_trip_with_optimizer_and_state(tmp_path, make_model):
    model = make_model(seed=1)
    opt = build_adam(model, lr=1e-2)
    model(torch.randint(0, 11, (2, 4))).sum().backward()
    opt.step()
    gen = torch.Generator().manual_seed(3)
    state = {"step": 7, "schedule": {"warmup": 4}, "data": {"epoch": 1, "generator": gen.get_state()}}
    save_checkpoint(tmp_path, "last", model, opt, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "last.safetensors"]
    # the trainer state is readable with weights_only=True
    raw = torch.load(tmp_path / "last.pt", weights_only=True)
    assert raw["state"]["step"] == 7

    model2 = make_model(seed=2)
    opt2 = build_adam(model2, lr=1e-2)
    loaded = load_checkpoint(tmp_path, "last", model2, opt2)
    assert loaded["step"] == 7 and loaded["schedule"] == {"warmup": 4}
    assert torch.equal(loaded["data"]["generator"], gen.get_state())
    _assert_same_weights(model, model2)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    for k in s1:
        for name in s1[k]:
            assert torch.equal(s1[k][name], s2[k][name])


def test_state_that_weights_only_load_would_refuse_is_rejected_with_its_key(tmp_path, make_model):
    with pytest.raises(CheckpointError, match=r"state\['data'\]\['perm'\] is a numpy.ndarray.*torch.from_numpy"):
        save_checkpoint(tmp_path, "last", make_model(), state={"data": {"perm": np.arange(3)}})
    assert list(tmp_path.iterdir()) == []


def test_optimizer_requested_but_not_saved(tmp_path, make_model):
    model = make_model()
    save_checkpoint(tmp_path, "w", model)
    with pytest.raises(CheckpointError, match="without an optimizer state"):
        load_checkpoint(tmp_path, "w", model, build_adam(model, lr=1e-3))
    with pytest.raises(CheckpointError, match="no such trainer-state file"):
        load_checkpoint(tmp_path, "other", model)


@pytest.mark.parametrize("failing", ["weights", "state"])
def test_failure_mid_save_keeps_the_previous_checkpoint(tmp_path, make_model, monkeypatch, failing):
    old = make_model(seed=1)
    save_checkpoint(tmp_path, "last", old, state={"step": 1})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    import errno

    import qkv.weights

    def half_then_full(obj, target, *args, **kwargs):  # ten bytes, then the disk is full
        if isinstance(target, str):  # safetensors writes to a path
            with open(target, "wb") as f:
                f.write(b"x" * 10)
        else:  # torch.save, to the file object it is given
            target.write(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    if failing == "weights":
        monkeypatch.setattr(qkv.weights, "save_model", half_then_full)
    else:
        monkeypatch.setattr(ckpt.torch, "save", half_then_full)
    new = make_model(seed=2)
    with pytest.raises(OSError, match="No space") as error:
        save_checkpoint(tmp_path, "last", new, state={"step": 2})
    monkeypatch.undo()
    # The error names the file being written (not its temporary), whichever library's write failed.
    assert error.value.filename == str(tmp_path / ("last.safetensors" if failing == "weights" else "last.pt"))

    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert _no_temp_files(tmp_path) == []
    fresh = make_model(seed=3)
    assert load_checkpoint(tmp_path, "last", fresh)["step"] == 1
    _assert_same_weights(old, fresh)


def _kill_between_the_renames(tmp_path, make_model, monkeypatch, keep_the_rest: bool):
    """Save seed 2 over seed 1 and die right after the weights' rename, as SIGKILL would: the new state
    stays in a temporary file of a process that is gone (or, ``keep_the_rest=False``, is lost too)."""
    import shutil

    save_checkpoint(tmp_path, "last", make_model(seed=1), state={"step": 1})
    real_replace = os.replace
    calls = []

    def replace_once_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            if keep_the_rest:  # what a killed process leaves: its complete temporary file
                shutil.copy(src, Path(dst).parent / f".{Path(dst).name}.tmp-999999999-0123abcd")
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(qkv.files.os, "replace", replace_once_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, "last", make_model(seed=2), state={"step": 2})
    monkeypatch.undo()


def test_a_kill_between_the_two_renames_is_finished_on_load(tmp_path, make_model, monkeypatch):
    _kill_between_the_renames(tmp_path, make_model, monkeypatch, keep_the_rest=True)
    model = make_model()
    with pytest.warns(UserWarning, match="interrupted between its two files; finished it"):
        state = load_checkpoint(tmp_path, "last", model)
    assert state == {"step": 2}  # the new checkpoint, whole
    for name, p in make_model(seed=2).state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name
    assert _no_temp_files(tmp_path) == []


def test_a_kill_between_the_renames_whose_other_half_is_gone_is_one_clear_error(tmp_path, make_model, monkeypatch):
    _kill_between_the_renames(tmp_path, make_model, monkeypatch, keep_the_rest=False)
    with pytest.raises(CheckpointError, match="different saves and the other half of the last save is gone"):
        load_checkpoint(tmp_path, "last", make_model())


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path, make_model):
    stale = tmp_path / ".last.pt.tmp-999999999-0123abcd"
    stale.write_bytes(b"half")
    mine_elsewhere = tmp_path / ".other.pt.tmp-999999999-0123abcd"
    mine_elsewhere.write_bytes(b"half")
    save_checkpoint(tmp_path, "last", make_model())
    assert not stale.exists()
    assert mine_elsewhere.exists()  # only the temporaries of the file being written are touched


def test_list_checkpoints_orders_by_step_and_skips_incomplete(tmp_path, make_model):
    model = make_model()
    for name in ("step_1000", "step_900", "step_20", "last"):
        save_checkpoint(tmp_path, name, model)
    (tmp_path / "step_5000.safetensors").write_bytes(b"")  # weights without state: incomplete
    assert list_checkpoints(tmp_path, "step_") == ["step_20", "step_900", "step_1000"]
    assert "last" in list_checkpoints(tmp_path)


class CompiledLike(torch.nn.Module):
    """Holds the model as ``_orig_mod``, as torch.compile's wrapper does (the real one costs seconds to import)."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


def test_compiled_model_is_saved_without_the_wrapper_prefix(tmp_path, make_model):
    model = make_model(seed=4)
    wrapped = CompiledLike(model)
    assert all(k.startswith("_orig_mod.") for k in wrapped.state_dict())
    path = save_weights(tmp_path / "m.safetensors", wrapped)
    assert not any(k.startswith("_orig_mod.") for k in load_file(path))
    fresh = make_model(seed=5)
    load_weights(path, CompiledLike(fresh))
    _assert_same_weights(model, fresh)
