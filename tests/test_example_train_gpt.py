"""The GPT example: paramdict.optim and torch.optim bit for bit, resumed, compiled."""

from __future__ import annotations

import io

import pytest
import torch
from _torch_versions import ONE_GRAPH
from torch._dynamo.utils import counters
from torch.torch_version import TorchVersion

from examples import train_gpt as gpt
from paramdict import ParamDict

# dim 128: the entries average over 4,096 elements, where `ParamDict.norm` (so the
# clipping) takes torch's per-entry foreach path and rounds as `clip_grad_norm_`.
CFG = gpt.Config(steps=6, checkpoint_at=3, batch=2, block=16, layers=1, warmup=2)


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, int]:
    """The example's corpus as tokens, and its alphabet's size."""
    tokens, alphabet = gpt.make_corpus(sentences=300)
    return tokens, len(alphabet)


@pytest.fixture(scope="module")
def torch_run(data: tuple[torch.Tensor, int]) -> gpt.Run:
    """The torch.optim program's run, the reference."""
    tokens, vocab = data
    return gpt.train_torch(CFG, tokens, vocab)


def _assert_same(
    run: gpt.Run, reference: gpt.Run, *, rtol: float = 0, atol: float = 0
) -> None:
    torch.testing.assert_close(run.losses, reference.losses, rtol=rtol, atol=atol)
    assert list(run.params) == list(reference.params)
    for k in reference.params:
        got, want = run.params[k], reference.params[k]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        torch.testing.assert_close(run.ema[k], reference.ema[k], rtol=rtol, atol=atol)


def test_corpus_and_batches_are_deterministic() -> None:
    """The text and each step's batch depend on the seed and step only."""
    a, alphabet = gpt.make_corpus(sentences=50, seed=1)
    b, _ = gpt.make_corpus(sentences=50, seed=1)
    assert torch.equal(a, b)
    assert set(alphabet) >= set("the cat.")
    x, y = gpt.get_batch(a, CFG, 3)
    assert x.shape == y.shape == (gpt.MICRO_BATCHES, CFG.batch, CFG.block)
    assert torch.equal(x[..., 1:], y[..., :-1])  # targets are the next tokens
    assert torch.equal(x, gpt.get_batch(a, CFG, 3)[0])


def test_embeddings_are_tied() -> None:
    """The output layer is the token embedding; the ParamDict holds it once."""
    program = gpt.make_program(CFG, vocab=20)
    assert program.model.lm_head.weight is program.model.wte.weight
    names = list(ParamDict.from_module(program.model))
    assert "wte.weight" in names
    assert "lm_head.weight" not in names


def test_decay_group_takes_the_matrices(data: tuple[torch.Tensor, int]) -> None:
    """AdamW decays the entries of two or more dimensions; the rest go undecayed."""
    _, vocab = data
    program = gpt.make_program(CFG, vocab)
    params = ParamDict.from_module(program.model).detach()
    decay, no_decay = program.opt.init(params)
    assert list(decay.exp_avg) == [k for k, v in params.items() if v.dim() >= 2]
    assert list(no_decay.exp_avg) == [k for k, v in params.items() if v.dim() < 2]
    assert "wte.weight" in decay.exp_avg
    assert "blocks.0.ln1.weight" in no_decay.exp_avg


def test_paramdict_program_is_torch_optim_bit_for_bit(
    data: tuple[torch.Tensor, int], torch_run: gpt.Run
) -> None:
    """Losses, weights and EMA equal torch.optim's program's exactly, and improve."""
    tokens, vocab = data
    logged: list[str] = []
    run = gpt.train_paramdict(
        CFG, tokens, gpt.make_program(CFG, vocab), log=logged.append
    )
    _assert_same(run, torch_run)
    assert run.losses[-1] < run.losses[0]
    assert logged[0].startswith("step    1  lr 3.00e-05")  # warm-up from 0.01 * 3e-3
    assert logged[-1].startswith(f"step {CFG.steps:4d}")


def test_logged_rates_are_torch_schedulers(data: tuple[torch.Tensor, int]) -> None:
    """`opt.last_lr(state)` before each step is torch's `get_last_lr()` (2 groups)."""
    tokens, vocab = data
    program = gpt.make_program(CFG, vocab)
    params = ParamDict.from_module(program.model).detach()
    state, ema_state = program.opt.init(params), program.ema.init(params)
    model = gpt.make_model(CFG, vocab)
    reference = torch.optim.AdamW(
        [
            {"params": [p for p in model.parameters() if p.dim() >= 2]},
            {"params": [p for p in model.parameters() if p.dim() < 2]},
        ],
        lr=CFG.lr,
    )
    warmup = torch.optim.lr_scheduler.LinearLR(
        reference, start_factor=0.01, total_iters=CFG.warmup
    )
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(
        reference, T_max=CFG.steps - CFG.warmup, eta_min=CFG.lr / 10
    )
    sched = torch.optim.lr_scheduler.SequentialLR(
        reference, [warmup, cosine], milestones=[CFG.warmup]
    )
    for it in range(CFG.steps):
        assert program.opt.last_lr(state) == sched.get_last_lr()
        assert program.opt.step_count(state) == it
        x, y = gpt.get_batch(tokens, CFG, it)
        params, state, ema_state, _ = program.step(params, state, ema_state, x, y)
        reference.step()
        sched.step()


def test_resumed_runs_equal_the_uninterrupted_ones(
    data: tuple[torch.Tensor, int], torch_run: gpt.Run
) -> None:
    """A run saved at step 3 and resumed from the file gives the same numbers."""
    tokens, vocab = data
    program = gpt.make_program(CFG, vocab)
    resumed = gpt.resumed(
        lambda stop, save, load: gpt.train_paramdict(
            CFG, tokens, program, stop=stop, checkpoint=save, resume=load
        ),
        CFG,
    )
    _assert_same(resumed, torch_run)
    torch_resumed = gpt.resumed(
        lambda stop, save, load: gpt.train_torch(
            CFG, tokens, vocab, stop=stop, checkpoint=save, resume=load
        ),
        CFG,
    )
    _assert_same(torch_resumed, torch_run)


def test_checkpoint_loads_with_weights_only(data: tuple[torch.Tensor, int]) -> None:
    """The checkpoint holds plain dicts, optimizer and EMA states: `weights_only`."""
    tokens, vocab = data
    buffer = io.BytesIO()
    gpt.train_paramdict(
        CFG, tokens, gpt.make_program(CFG, vocab), stop=2, checkpoint=buffer
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert set(saved) == {"params", "state", "ema"}
    assert int(saved["ema"].n_averaged) == 2


@ONE_GRAPH
def test_compiled_step_is_one_graph_with_eager_numbers(
    data: tuple[torch.Tensor, int], torch_run: gpt.Run
) -> None:
    """The step compiled with `fullgraph=True` runs, and resumes, on one graph.

    It agrees with torch's fused program to float32 rounding, and its resumed
    run equals its uninterrupted one bit for bit.
    """
    tokens, vocab = data
    torch._dynamo.reset()
    counters.clear()
    # The "eager" backend keeps this test fast; it traces the graph inductor compiles.
    program = gpt.make_program(CFG, vocab, compiled=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        run = gpt.train_paramdict(CFG, tokens, program)
        resumed = gpt.resumed(
            lambda stop, save, load: gpt.train_paramdict(
                CFG, tokens, program, stop=stop, checkpoint=save, resume=load
            ),
            CFG,
        )
    assert counters["stats"]["unique_graphs"] == 1
    # Traced, AdamW runs its foreach rule; torch's program runs the fused kernel.
    _assert_same(run, torch_run, rtol=1e-4, atol=5e-5)
    _assert_same(resumed, run)


def test_command_line_prints_the_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    """`python examples/train_gpt.py` trains every program and reports agreement."""
    args = "--steps 4 --batch 2 --block 8 --layers 1 --quiet --no-compile"
    runs = gpt.main(args.split())
    out = capsys.readouterr().out
    assert set(runs) == {
        "paramdict",
        "torch.optim",
        "paramdict, resumed",
        "torch.optim, resumed",
    }
    assert out.count("bitwise") == 4


def test_compile_on_a_torch_before_2_8_points_to_no_compile(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On torch 2.6, `--compile` (the default) stops at once, naming 2.8 and the fix."""
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.6.0"))
    with pytest.raises(SystemExit) as stopped:
        gpt.main(["--steps", "4", "--quiet"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "needs torch>=2.8 (this is 2.6.0); run with --no-compile" in err
