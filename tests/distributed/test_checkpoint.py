"""Checkpoints of sharded models: save, a fresh process, restore, resume with the same losses.

Two ways: torch.distributed.checkpoint (DCP, in its no-process-group mode) with eager steps,
and torchlax's ``Checkpointer`` (orbax-checkpoint) with a ``torchlax.jit`` step. Each run starts
a fresh process with 8 simulated devices; one training process saves both checkpoints and one
fresh process restores each into its own model.
"""

import json

import pytest
from _multidevice import run_on_devices

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow

TRAINING = """
    import json
    import torchlax
    from _model import TinyTransformer, loss_fn

    # Every op compiled from its first call: both processes then run the same executables (by
    # default an op's first calls run op by op, which may round differently than the fused one)
    torchlax_core.default_env().config.op_cache_min_calls = 1

    mesh = D.make_mesh((2, 4), ("data", "model"))
    torch.manual_seed(0)
    batches = [(torch.randint(0, 64, (8, 8)), torch.randint(0, 64, (8, 8))) for _ in range(4)]

    def build(seed, jit=False):
        torch.manual_seed(seed)
        model = TinyTransformer(layers=1).to("jax")
        D.shard(model, mesh, D.megatron_rules("model", data_axis="data"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(tokens, targets):
            opt.zero_grad()
            loss = loss_fn(model, tokens, targets)
            loss.backward()
            opt.step()
            return loss

        return model, opt, (torchlax.jit(step) if jit else step)

    def run(step, i):
        tokens, targets = batches[i]
        tokens = D.shard(tokens.to("jax"), mesh, P("data"))
        return float(step(tokens, D.shard(targets.to("jax"), mesh, P("data"))))

    def layouts(model, opt):
        return {n: str(p.jax().sharding) for n, p in model.named_parameters()}
"""

DCP_SAVE = """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def save_dcp(model, opt, step):
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=CKPT + "_dcp")
"""

DCP_RESTORE = """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def restore_dcp(model, opt):
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=CKPT + "_dcp")
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
"""

ORBAX_SAVE = """
    checkpointer = D.Checkpointer(CKPT + "_orbax")

    def save_orbax(model, opt, step):
        assert checkpointer.save(step, model, opt)   # returns while the files are written
"""

ORBAX_RESTORE = """
    def restore_orbax(model, opt):
        with D.Checkpointer(CKPT + "_orbax") as checkpointer:
            assert checkpointer.latest_step() == 2
            assert checkpointer.restore(model, opt) == 2
        for p in model.parameters():  # a fresh optimizer's state: read in as its parameter's
            assert opt.state[p]["exp_avg"].jax().sharding == p.jax().sharding
            assert opt.state[p]["exp_avg_sq"].jax().sharding == p.jax().sharding
"""

UNINTERRUPTED = """
    first = {}
    with torchlax_core.enable(), D.mesh_placement(mesh):
        for way, save, jit in (("dcp", save_dcp, False), ("orbax", save_orbax, True)):
            model, opt, step = build(seed=1, jit=jit)
            losses = [run(step, 0), run(step, 1)]
            saved = layouts(model, opt)
            save(model, opt, 2)   # the state after two steps
            losses += [run(step, 2), run(step, 3)]   # training goes on while a save is written
            first[way] = {"losses": losses, "layouts": saved}
    checkpointer.close()
    print(json.dumps(first))
"""

RESUMED = """
    resumed = {}
    with torchlax_core.enable(), D.mesh_placement(mesh):
        for way, restore, jit in (("dcp", restore_dcp, False), ("orbax", restore_orbax, True)):
            model, opt, step = build(seed=2, jit=jit)   # other weights, to be overwritten
            params = list(model.parameters())
            restore(model, opt)
            assert list(model.parameters()) == params   # the same Parameter objects, in place
            restored = layouts(model, opt)
            resumed[way] = {"losses": [run(step, 2), run(step, 3)], "layouts": restored}
            if jit:   # the first call's program is the steady one (no .grads in): one compile
                resumed[way]["compilations"] = step.compilations
    print(json.dumps(resumed))
"""


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def test_save_restore_in_a_fresh_process_resumes_with_identical_losses(tmp_path):
    where = f"CKPT = {str(tmp_path / 'ckpt')!r}\n"
    first = _last_json(run_on_devices(where, TRAINING, DCP_SAVE, ORBAX_SAVE, UNINTERRUPTED))
    second = _last_json(run_on_devices(where, TRAINING, DCP_RESTORE, ORBAX_RESTORE, RESUMED))
    for way in ("dcp", "orbax"):  # eager steps, torchlax.jit steps
        assert second[way]["losses"] == first[way]["losses"][2:], way  # bit for bit
        assert second[way]["layouts"] == first[way]["layouts"], way
    assert second["orbax"]["compilations"] == 1


def test_load_state_dict_and_copy_keep_the_destinations_layout():
    run_on_devices("""
        from _model import TinyTransformer

        mesh = D.make_mesh((2, 4), ("data", "model"))
        torch.manual_seed(0)
        reference = TinyTransformer(layers=1).state_dict()
        with torchlax_core.enable():
            model = TinyTransformer(layers=1).to("jax")
            D.shard(model, mesh, D.megatron_rules("model", data_axis="data"))
            laid_out = {n: p.jax().sharding for n, p in model.named_parameters()}
            assert len(laid_out["layers.0.attn.q_proj.weight"].device_set) == 8
            for source in (reference, {k: v.to("jax") for k, v in reference.items()}):
                model.load_state_dict(source)  # param.copy_(value): CPU, then one JAX device
                for name, p in model.named_parameters():
                    assert p.jax().sharding == laid_out[name], (name, p.jax().sharding)
                    assert torch.equal(p.detach().cpu(), reference[name]), name

            # a write through a view of a sharded tensor keeps the base's layout
            w = D.shard(torch.zeros(8, 4).to("jax"), mesh, P("model", None))
            w[2:4].copy_(torch.ones(2, 4))
            assert w.jax().sharding == NamedSharding(mesh, P("model", None)), w.jax().sharding
            assert torch.equal(w.cpu(), torch.zeros(8, 4).index_fill_(0, torch.tensor([2, 3]), 1))

            # as cuda:3 in PyTorch: a tensor placed on one device stays there
            t = torch.zeros(4, device="jax:3")
            t.copy_(torch.arange(4.0))
            assert t.jax().devices() == {jax.devices()[3]}, t.jax().devices()
            assert torch.equal(t.cpu(), torch.arange(4.0))
        print("ok")
    """)
