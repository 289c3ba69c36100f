"""``Checkpointer`` on one device and on the CPU: values, dtypes, hyperparameters, errors."""

import pytest
import torch
import torchlax_core
from torchlax_interop.distributed import Checkpointer, CheckpointError


def _model_and_optimizer(device, out_features=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, out_features), torch.nn.LayerNorm(out_features))
    # a frozen bfloat16 parameter (numpy holds it through ml_dtypes): it gets no momentum
    scale = torch.nn.Parameter(torch.full((3,), 1.5).bfloat16(), requires_grad=False)
    model.register_parameter("scale", scale)
    model.register_buffer("count", torch.tensor([2**40, 7]))  # int64 beyond int32
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def _train(model, opt, device):
    x = torch.randn(2, 4).to(device)
    model(x).float().sum().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("device", ["jax", "cpu"])
def test_restore_gives_back_every_value_in_place(tmp_path, device):
    torchlax_core.default_env()
    model, opt = _model_and_optimizer(device)
    _train(model, opt, device)
    with Checkpointer(tmp_path) as checkpointer:
        assert checkpointer.save(5, model, opt)
        checkpointer.wait()
        assert checkpointer.all_steps() == [5]
    saved = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    trained = [p for p in model.parameters() if p.requires_grad]
    momenta = [opt.state[p]["momentum_buffer"].cpu().clone() for p in trained]

    fresh, fresh_opt = _model_and_optimizer(device)
    fresh_opt.param_groups[0]["lr"] = 1.0
    params = list(fresh.parameters())
    with torch.no_grad():
        for p in params:
            p.add_(1)
    with Checkpointer(tmp_path) as checkpointer:
        assert checkpointer.restore(fresh, fresh_opt) == 5
    assert list(fresh.parameters()) == params  # the same objects, written in place
    for name, value in fresh.state_dict().items():
        assert value.dtype == saved[name].dtype, name
        assert torch.equal(value.cpu(), saved[name]), name
        assert isinstance(value, torchlax_core.Tensor) == (device == "jax"), name
    assert len(fresh_opt.state) == 4  # no momentum for the frozen parameter
    for p, momentum in zip([p for p in fresh.parameters() if p.requires_grad], momenta):
        assert torch.equal(fresh_opt.state[p]["momentum_buffer"].cpu(), momentum)
    assert fresh_opt.param_groups[0]["lr"] == 0.1  # hyperparameters are restored too


def test_restore_without_a_checkpoint_says_so(tmp_path):
    model, opt = _model_and_optimizer("cpu")
    with Checkpointer(tmp_path) as checkpointer, pytest.raises(CheckpointError, match="holds no"):
        checkpointer.restore(model, opt)


def test_restore_into_another_shape_names_the_tensor(tmp_path):
    model, opt = _model_and_optimizer("cpu")
    with Checkpointer(tmp_path, async_save=False) as checkpointer:
        checkpointer.save(1, model, opt)
        other, other_opt = _model_and_optimizer("cpu", out_features=5)
        with pytest.raises(CheckpointError, match=r"'0.weight'.* shape \(3, 4\)"):
            checkpointer.restore(other, other_opt)


def test_restore_into_other_names_lists_them(tmp_path):
    model, _ = _model_and_optimizer("cpu")
    with Checkpointer(tmp_path, async_save=False) as checkpointer:
        checkpointer.save(1, model)
        other = torch.nn.Sequential(torch.nn.Linear(4, 3))
        with pytest.raises(CheckpointError, match=r"not in the model or optimizer \['1.bias'"):
            checkpointer.restore(other)


def test_the_arrays_carry_the_state_names(tmp_path):
    # The names torch.distributed.checkpoint gives (parameter FQNs; optimizer state by the
    # parameter's FQN), so orbax's own tools read a checkpoint by them
    import orbax.checkpoint as ocp

    model, opt = _model_and_optimizer("cpu")
    _train(model, opt, "cpu")
    with Checkpointer(tmp_path, async_save=False) as checkpointer:
        checkpointer.save(3, model, opt)
    manager = ocp.CheckpointManager(str(tmp_path))
    args = ocp.args.Composite(arrays=ocp.args.StandardRestore())
    arrays = manager.restore(3, args=args)["arrays"]
    manager.close()
    assert sorted(arrays["model"]) == sorted(model.state_dict())
    assert sorted(arrays["optim"]["state"]) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert set(arrays["optim"]["state"]["0.weight"]) == {"momentum_buffer"}
    assert (arrays["model"]["0.weight"] == model[0].weight.detach().numpy()).all()
