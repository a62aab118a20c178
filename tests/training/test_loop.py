"""The pieces every trainer shares (qkv.training.loop): one update, the cadence, checkpoints, export."""

import math

import pytest
import torch
from torch import nn

from qkv.errors import ConfigError
from qkv.training.logging import NonFiniteLossError
from qkv.recipes import LoopConfig
from qkv.training.loop import (
    Cadence, LoopState, Runtime, check_same_run, export, optimizer_step, resume_state, save_state,
)


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _backward(model, scale=1.0):
    loss = (model(torch.ones(4, 3)) * scale).pow(2).mean()
    loss.backward()
    return loss


def test_optimizer_step_updates_and_clears_the_gradients():
    model, opt = _model_and_optimizer()
    before = model.weight.detach().clone()
    value = optimizer_step(opt, _backward(model), 1, clip_norm=1.0, parameters=model.parameters())
    assert math.isfinite(value) and not torch.equal(model.weight, before)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_optimizer_step_never_applies_a_non_finite_update(what):
    model, opt = _model_and_optimizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = _backward(model)
    if what == "loss":
        loss = loss * float("nan")
    else:  # a finite loss whose gradient overflowed
        model.weight.grad[0, 0] = float("inf")
    with pytest.raises(NonFiniteLossError, match="step 7"):
        optimizer_step(opt, loss, 7, clip_norm=0.0, parameters=model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_with_an_fp16_scaler_an_overflow_skips_the_update_and_lowers_the_scale():
    """fp16 training: an infinite gradient is the loss scale overflowing, so it is skipped, not fatal."""
    model, opt = _model_and_optimizer()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = model(torch.ones(4, 3)).pow(2).mean()
    scaler.scale(loss).backward()
    model.weight.grad[0, 0] = float("inf")
    optimizer_step(opt, loss.detach(), 3, clip_norm=1.0, parameters=model.parameters(), scaler=scaler)
    assert scaler.get_scale() == 512.0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # A finite step goes through the scaler: the gradients it scaled are unscaled before the update.
    (scaled, scaled_opt), (plain, plain_opt) = _model_and_optimizer(), _model_and_optimizer()
    scaled_scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    loss = scaled(torch.ones(4, 3)).pow(2).mean()
    scaled_scaler.scale(loss).backward()
    optimizer_step(scaled_opt, loss.detach(), 1, 0.0, scaled.parameters(), scaled_scaler)
    optimizer_step(plain_opt, _backward(plain), 1, 0.0, plain.parameters())
    for a, b in zip(scaled.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)


def test_half_precision_is_for_gpus():
    from qkv.devices import autocast_dtype

    assert autocast_dtype("auto", torch.device("cpu")) is None
    for dtype in ("bf16", "fp16"):
        with pytest.raises(ValueError, match=f"dtype '{dtype}' is for CUDA only"):
            autocast_dtype(dtype, torch.device("cpu"))


def test_a_nan_evaluation_is_never_the_best():
    state = LoopState()
    assert not state.improve(float("nan")) and state.best == math.inf and state.bad_evals == 1
    assert state.improve(2.0) and state.bad_evals == 0
    assert not state.improve(float("nan")) and state.best == 2.0


def test_cadence_ends_with_an_evaluation_at_the_step_or_time_budget():
    cfg = LoopConfig(steps=5, eval_every=2, log_every=3)
    cadence = Cadence(cfg, LoopState())
    seen = []
    while cadence.running():
        step = cadence.begin_step()
        cadence.end_step()
        seen.append((step, cadence.log_due, cadence.eval_due, cadence.last))
    assert seen == [(1, False, False, False), (2, False, True, False), (3, True, False, False),
                    (4, False, True, False), (5, True, True, True)]
    assert cadence.stop_reason == "max_steps"
    timed = Cadence(LoopConfig(steps=100, max_minutes=1e-9), LoopState())
    timed.begin_step()
    timed.end_step()
    assert timed.last and timed.eval_due and not timed.running() and timed.stop_reason == "max_minutes"


def test_loop_config_checks_its_knobs():
    for bad in ({"steps": 0}, {"accumulate": 0}, {"warmup": -1}, {"max_minutes": 0}, {"dtype": "fp8"}):
        with pytest.raises(ConfigError):
            LoopConfig(**bad)


def test_checkpoints_resume_and_refuse_non_finite_weights(tmp_path):
    runtime = Runtime(torch.device("cpu"))
    model, opt = _model_and_optimizer()
    optimizer_step(opt, _backward(model), 1, 1.0, model.parameters())
    state = LoopState(step=1, seconds=2.5, best=0.5)
    save_state(tmp_path, model, opt, state, runtime, extra={"note": "kept"})
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="weight"):
        save_state(tmp_path, model, opt, LoopState(step=2), runtime)
    with pytest.raises(NonFiniteLossError, match="export"):
        export(tmp_path, model, runtime)
    assert not (tmp_path / "model.safetensors").exists()

    fresh, fresh_opt = _model_and_optimizer(seed=1)
    resumed = LoopState()
    extra = resume_state(tmp_path, fresh, fresh_opt, resumed)
    assert resumed == state and extra["note"] == "kept"  # the last good checkpoint, whole
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_a_checkpoint_of_the_trainers_before_the_shared_loop_resumes(tmp_path):
    """Checkpoints written before the trainers shared loop.py kept step, best and time at the top level."""
    from qkv.training.checkpoint import save_checkpoint

    model, opt = _model_and_optimizer()
    save_checkpoint(tmp_path, "last", model, opt, {"step": 3, "best_valid": 1.5, "elapsed": 2.0})
    state = LoopState()
    resume_state(tmp_path, *_model_and_optimizer(seed=1), state)
    assert state == LoopState(step=3, seconds=2.0, best=1.5, bad_evals=0)
    save_checkpoint(tmp_path, "last", model, opt, {"step": 4, "best": None, "bad_evals": 1, "train_seconds": 5.0})
    resume_state(tmp_path, *_model_and_optimizer(seed=1), state)  # translation's layout, before its first best
    assert state == LoopState(step=4, seconds=5.0, best=math.inf, bad_evals=1)


def test_a_launched_process_without_its_backend_gets_one_clear_error(monkeypatch):
    import torch.distributed as dist

    from qkv.errors import DeviceError
    from qkv.training import distributed

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_backend_available", lambda name: False)
    with pytest.raises(DeviceError, match="gloo backend is not in this build of torch"):
        distributed.join(torch.device("cpu"))


def test_the_collective_timeout_is_read_from_the_environment(monkeypatch):
    from qkv.training import distributed

    assert distributed.collective_timeout().total_seconds() == distributed.TIMEOUT_SECONDS
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "2.5")
    assert distributed.collective_timeout().total_seconds() == 2.5
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="QKV_COLLECTIVE_TIMEOUT='soon'"):
        distributed.collective_timeout()


def test_the_launcher_hands_torchrun_the_command_without_itself():
    from qkv.training.distributed import without_launcher

    argv = ["train", "lm", "--nproc-per-node", "2", "--run", "r", "--nproc-per-node=4", "x=1"]
    assert without_launcher(argv) == ["train", "lm", "--run", "r", "x=1"]


def test_a_resume_names_each_fixed_setting_it_would_change_and_skips_what_an_older_record_lacks():
    saved = {"model.d_model": 128, "data.split": "position"}
    check_same_run(saved, {**saved, "model.rope_scale": 32})  # a setting added since the run was written
    with pytest.raises(ConfigError, match=r"model.d_model=64 \(the run's: 128\); data.split='documents' \(the run's: "
                                          r"'position'\) would make it another run"):
        check_same_run(saved, {"model.d_model": 64, "data.split": "documents"})
