"""Train a small GPT the nanoGPT way, with paramdict.optim and with torch.optim.

The recipe: a character-level GPT with tied input and output embeddings; AdamW with
weight decay on the tensors of two or more dimensions only; a linear warm-up, then a
cosine decay; gradients clipped to a global norm of 1; two micro-batches per step; an
exponential moving average (EMA) of the weights; a checkpoint in the middle of the
run, from which a second run resumes. The text is generated here from a small
grammar, so nothing is downloaded.

The paramdict program is one step function, `train_step`, that runs eager or under
`torch.compile(fullgraph=True)` unchanged; the torch.optim program is the usual
module loop. Eager, the two give the same losses and weights bit for bit.

    python examples/train_gpt.py                 # both programs, eager and compiled
    python examples/train_gpt.py --steps 50 --no-compile
"""

from __future__ import annotations

import argparse
import io
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import lr_scheduler as tls
from torch.optim import swa_utils

from paramdict import ParamDict, optim

MICRO_BATCHES = 2
"""The micro-batches whose gradients add up to one optimizer step."""


@dataclass(frozen=True)
class Config:
    """The sizes of the model, the data and the run."""

    steps: int = 200
    checkpoint_at: int = 100
    batch: int = 16  # sequences per micro-batch
    block: int = 32  # tokens per sequence
    layers: int = 2
    heads: int = 2
    dim: int = 128
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    ema_decay: float = 0.99
    seed: int = 0


# ---------------------------------------------------------------------------- data

_GRAMMAR = {
    "S": [["NP", "VP", "."]],
    "NP": [["the", "N"], ["a", "N"], ["the", "A", "N"]],
    "VP": [["V", "NP"], ["V"], ["V", "NP", "P", "NP"]],
    "N": [["cat"], ["dog"], ["bird"], ["fish"], ["child"]],
    "A": [["small"], ["red"], ["old"]],
    "V": [["sees"], ["likes"], ["chases"], ["sleeps"]],
    "P": [["near"], ["with"]],
}


def make_corpus(sentences: int = 2000, seed: int = 0) -> tuple[Tensor, str]:
    """Return a text generated from a small grammar, as tokens, and its alphabet."""
    rng = random.Random(seed)

    def expand(symbol: str) -> list[str]:
        if symbol not in _GRAMMAR:
            return [symbol]
        return [word for part in rng.choice(_GRAMMAR[symbol]) for word in expand(part)]

    text = " ".join(" ".join(expand("S")) for _ in range(sentences))
    alphabet = "".join(sorted(set(text)))
    tokens = torch.tensor([alphabet.index(c) for c in text], dtype=torch.long)
    return tokens, alphabet


def get_batch(tokens: Tensor, cfg: Config, step: int) -> tuple[Tensor, Tensor]:
    """Return step `step`'s inputs and targets, `(MICRO_BATCHES, batch, block)` each.

    The batch depends on the step alone, so a resumed run sees the data the
    uninterrupted run saw.
    """
    rng = random.Random(cfg.seed * 1_000_003 + step)
    count = MICRO_BATCHES * cfg.batch
    starts = torch.tensor(
        [rng.randrange(len(tokens) - cfg.block) for _ in range(count)]
    )
    window = torch.arange(cfg.block)
    x = tokens[starts[:, None] + window]
    y = tokens[starts[:, None] + window + 1]
    shape = (MICRO_BATCHES, cfg.batch, cfg.block)
    return x.view(shape), y.view(shape)


# --------------------------------------------------------------------------- model


class Block(nn.Module):
    """A transformer block: causal self-attention and an MLP, both pre-norm."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        """Return the block's output for `x` of shape `(batch, time, dim)`."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        mlp: Tensor = self.out(F.gelu(self.fc(self.ln2(x))))
        return x + mlp


class GPT(nn.Module):
    """A small GPT whose output layer shares the token embedding's weight."""

    def __init__(self, cfg: Config, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, cfg.dim)
        self.wpe = nn.Embedding(cfg.block, cfg.dim)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads) for _ in range(cfg.layers)
        )
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for module in self.modules():  # nanoGPT's initialization
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module is not self.lm_head:
                nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        """Return the next-token logits for the tokens `idx`, `(batch, time)`."""
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.lm_head(self.ln_f(x))
        return logits


def make_model(cfg: Config, vocab: int) -> GPT:
    """Return the model with the run's initial weights."""
    torch.random.manual_seed(cfg.seed)  # pyright: ignore[reportUnknownMemberType] (untyped in torch)
    return GPT(cfg, vocab)


# ------------------------------------------------------------ the paramdict program


def is_matrix(name: str, tensor: Tensor) -> bool:
    """Whether an entry is weight-decayed: nanoGPT decays tensors of 2+ dimensions."""
    return tensor.dim() >= 2


def make_schedule(cfg: Config) -> optim.SequentialLR:
    """Return the linear warm-up, then cosine decay to a tenth of `cfg.lr`."""
    return optim.SequentialLR(
        base_lr=cfg.lr,
        schedulers=[
            optim.LinearLR(start_factor=0.01, total_iters=cfg.warmup),
            optim.CosineAnnealingLR(T_max=cfg.steps - cfg.warmup, eta_min=cfg.lr / 10),
        ],
        milestones=[cfg.warmup],
    )


def make_optimizer(cfg: Config) -> optim.ClipGradNorm[tuple[optim.AdamState, ...]]:
    """Return AdamW with decay and no-decay groups, clipping the gradients first."""
    schedule = make_schedule(cfg)
    betas = (0.9, 0.95)
    decay = optim.AdamW(lr=schedule, betas=betas, weight_decay=cfg.weight_decay)
    no_decay = optim.AdamW(lr=schedule, betas=betas, weight_decay=0.0)
    groups = optim.ParamGroups({is_matrix: decay}, default=no_decay)
    return optim.ClipGradNorm(groups, max_norm=1.0)


def typical(times: list[float]) -> float:
    """Return the median step time after the first step (which warms up caches)."""
    return statistics.median(times[1:] or times or [0.0])


class Run(NamedTuple):
    """What a run leaves: its losses, final weights, their EMA, median step time."""

    losses: list[float]
    params: dict[str, Tensor]
    ema: dict[str, Tensor]
    seconds_per_step: float


def make_train_step(
    model: nn.Module,
    opt: optim.ClipGradNorm[tuple[optim.AdamState, ...]],
    ema: optim.WeightAverage,
) -> Callable[..., Any]:
    """Return one training step: two micro-batches, an optimizer step, the EMA."""

    def loss_fn(params: ParamDict, x: Tensor, y: Tensor) -> Tensor:
        logits: Tensor = params.call(model, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return loss / MICRO_BATCHES

    grad_and_loss = torch.func.grad_and_value(loss_fn)

    def train_step(
        params: ParamDict,
        state: tuple[optim.AdamState, ...],
        ema_state: optim.AveragedState,
        x: Tensor,
        y: Tensor,
    ) -> tuple[ParamDict, tuple[optim.AdamState, ...], optim.AveragedState, Tensor]:
        grads, loss = grad_and_loss(params, x[0], y[0])
        for i in range(1, MICRO_BATCHES):
            more, more_loss = grad_and_loss(params, x[i], y[i])
            grads, loss = grads.add(more), loss + more_loss
        params, state = opt.step(params, grads, state)
        return params, state, ema.update(ema_state, params), loss

    return train_step


class Program(NamedTuple):
    """The paramdict program: the model, the optimizer, the EMA and the step."""

    model: GPT
    opt: optim.ClipGradNorm[tuple[optim.AdamState, ...]]
    ema: optim.WeightAverage
    step: Callable[..., Any]


def make_program(
    cfg: Config, vocab: int, *, compiled: bool = False, backend: str = "inductor"
) -> Program:
    """Return the program; `compiled` compiles its step with `fullgraph=True`."""
    model = make_model(cfg, vocab)
    opt = make_optimizer(cfg)
    ema = optim.WeightAverage.ema(cfg.ema_decay)
    step = make_train_step(model, opt, ema)
    if compiled:
        # torch types `compile`'s `backend` callable loosely.
        # torch types the `backend` callable of `compile` loosely (Unknown).
        step = torch.compile(step, fullgraph=True, backend=backend)  # pyright: ignore[reportUnknownMemberType]
    return Program(model, opt, ema, step)


def train_paramdict(
    cfg: Config,
    tokens: Tensor,
    program: Program,
    *,
    stop: int | None = None,
    checkpoint: io.BytesIO | None = None,
    resume: io.BytesIO | None = None,
    log: Callable[[str], None] | None = None,
) -> Run:
    """Train with paramdict.optim, from the start or from the checkpoint `resume`.

    The run stops before step `stop` (default `cfg.steps`) and saves `checkpoint`
    there if given.
    """
    opt, ema, step = program.opt, program.ema, program.step
    if resume is None:
        params = ParamDict.from_module(program.model).detach()
        state, ema_state = opt.init(params), ema.init(params)
    else:
        resume.seek(0)
        saved = torch.load(resume, weights_only=True)
        params = ParamDict(saved["params"])
        state, ema_state = saved["state"], saved["ema"]
    losses: list[float] = []
    start = opt.step_count(state)
    end = cfg.steps if stop is None else stop
    times: list[float] = []
    for it in range(start, end):
        began = time.perf_counter()
        x, y = get_batch(tokens, cfg, it)
        lr = opt.last_lr(state)[0]
        params, state, ema_state, loss = step(params, state, ema_state, x, y)
        losses.append(float(loss))
        times.append(time.perf_counter() - began)
        if log is not None and (it % 25 == 0 or it == end - 1):
            log(f"step {opt.step_count(state):4d}  lr {lr:.2e}  loss {losses[-1]:.4f}")
    if checkpoint is not None:
        saved = {"params": dict(params), "state": state, "ema": ema_state}
        torch.save(saved, checkpoint)
    return Run(losses, dict(params), dict(ema_state.averaged), typical(times))


# ------------------------------------------------------------ the torch.optim program


Tensors = tuple[Tensor, ...] | list[Tensor]


def ema_update(decay: float) -> Callable[[Tensors, Tensors, Tensor | int], None]:
    """Return `get_ema_multi_avg_fn(decay)`'s update, a lerp by `1 - decay`, typed."""

    def update(averaged: Tensors, current: Tensors, count: Tensor | int) -> None:
        torch._foreach_lerp_(list(averaged), list(current), 1 - decay)

    return update


def train_torch(
    cfg: Config,
    tokens: Tensor,
    vocab: int,
    *,
    stop: int | None = None,
    checkpoint: io.BytesIO | None = None,
    resume: io.BytesIO | None = None,
) -> Run:
    """Train the same model with torch.optim, its schedulers and `AveragedModel`."""
    model = make_model(cfg, vocab)
    named = list(model.named_parameters())
    groups = [
        {
            "params": [p for n, p in named if is_matrix(n, p)],
            "weight_decay": cfg.weight_decay,
        },
        {"params": [p for n, p in named if not is_matrix(n, p)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=True)
    warmup = tls.LinearLR(opt, start_factor=0.01, total_iters=cfg.warmup)
    cosine = tls.CosineAnnealingLR(
        opt, T_max=cfg.steps - cfg.warmup, eta_min=cfg.lr / 10
    )
    sched = tls.SequentialLR(opt, [warmup, cosine], milestones=[cfg.warmup])
    ema = swa_utils.AveragedModel(model, multi_avg_fn=ema_update(cfg.ema_decay))
    start = 0
    if resume is not None:
        resume.seek(0)
        saved = torch.load(resume, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        ema.load_state_dict(saved["ema"])
        start = saved["step"]
    losses: list[float] = []
    end = cfg.steps if stop is None else stop
    times: list[float] = []
    for it in range(start, end):
        began = time.perf_counter()
        x, y = get_batch(tokens, cfg, it)
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for i in range(MICRO_BATCHES):
            logits = model(x[i])
            loss = F.cross_entropy(logits.flatten(0, 1), y[i].flatten()) / MICRO_BATCHES
            torch.autograd.backward(loss)
            total = total + loss.detach() if i else loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()  # pyright: ignore[reportUnknownMemberType] (torch's untyped closure)
        sched.step()
        ema.update_parameters(model)
        losses.append(float(total))
        times.append(time.perf_counter() - began)
    if checkpoint is not None:
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "ema": ema.state_dict(),
                "step": end,
            },
            checkpoint,
        )
    averaged = {n: p.detach() for n, p in ema.module.named_parameters()}
    params = {n: p.detach() for n, p in model.named_parameters()}
    return Run(losses, params, averaged, typical(times))


# ---------------------------------------------------------------------------- main


def same(a: Run, b: Run) -> bool:
    """Whether two runs have the same losses, weights and EMA, bit for bit."""
    return (
        a.losses == b.losses
        and a.params.keys() == b.params.keys()
        and all(torch.equal(a.params[k], b.params[k]) for k in a.params)
        and all(torch.equal(a.ema[k], b.ema[k]) for k in a.ema)
    )


Trainer = Callable[[int | None, io.BytesIO | None, io.BytesIO | None], Run]
"""A run given where to stop, where to save and what to resume from."""


def resumed(train: Trainer, cfg: Config) -> Run:
    """Run to `cfg.checkpoint_at` and save, then resume from the file in a new run."""
    buffer = io.BytesIO()
    first = train(cfg.checkpoint_at, buffer, None)
    second = train(None, None, buffer)
    return second._replace(losses=first.losses + second.losses)


def main(argv: Sequence[str] | None = None) -> dict[str, Run]:
    """Run the programs side by side and print how they compare."""
    parser = argparse.ArgumentParser(
        description="Train a small GPT with paramdict.optim and torch.optim."
    )
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--checkpoint-at", type=int, default=None)
    parser.add_argument("--batch", type=int, default=Config.batch)
    parser.add_argument("--block", type=int, default=Config.block)
    parser.add_argument("--layers", type=int, default=Config.layers)
    parser.add_argument("--dim", type=int, default=Config.dim)
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--backend", default="inductor", help="the torch.compile backend (inductor)"
    )
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)
    # `torch.__version__` compares as a version, not as text.
    if args.compile and torch.__version__ < "2.8":
        parser.error(
            "--compile traces the step in one graph (fullgraph=True), which needs "
            f"torch>=2.8 (this is {torch.__version__}); run with --no-compile."
        )
    cfg = Config(
        steps=args.steps,
        checkpoint_at=args.checkpoint_at or args.steps // 2,
        batch=args.batch,
        block=args.block,
        layers=args.layers,
        dim=args.dim,
        warmup=max(1, args.steps // 10),
    )
    return compare(cfg, compiled=args.compile, backend=args.backend, quiet=args.quiet)


def compare(
    cfg: Config, *, compiled: bool, backend: str, quiet: bool
) -> dict[str, Run]:
    """Train eager, resumed, with torch.optim and compiled; print the comparison."""
    tokens, alphabet = make_corpus(seed=cfg.seed)
    vocab = len(alphabet)
    log = None if quiet else print
    eager = make_program(cfg, vocab)
    runs = {
        "paramdict": train_paramdict(cfg, tokens, eager, log=log),
        "torch.optim": train_torch(cfg, tokens, vocab),
        "paramdict, resumed": resumed(
            lambda stop, save, load: train_paramdict(
                cfg, tokens, eager, stop=stop, checkpoint=save, resume=load
            ),
            cfg,
        ),
        "torch.optim, resumed": resumed(
            lambda stop, save, load: train_torch(
                cfg, tokens, vocab, stop=stop, checkpoint=save, resume=load
            ),
            cfg,
        ),
    }
    if compiled:
        program = make_program(cfg, vocab, compiled=True, backend=backend)
        began = time.perf_counter()
        train_paramdict(cfg, tokens, program, stop=1)  # compiles the step
        print(f"compiling the step took {time.perf_counter() - began:.1f} s")
        # One graph for every step, resumed ones included: a recompile is an error.
        torch._dynamo.config.error_on_recompile = True
        try:
            runs["paramdict, compiled"] = train_paramdict(cfg, tokens, program)
            runs["paramdict, compiled, resumed"] = resumed(
                lambda stop, save, load: train_paramdict(
                    cfg, tokens, program, stop=stop, checkpoint=save, resume=load
                ),
                cfg,
            )
        finally:
            torch._dynamo.config.error_on_recompile = False
    reference = runs["torch.optim"]
    for name, run in runs.items():
        if same(run, reference):
            agree = "bitwise"
        else:
            gaps = zip(run.losses, reference.losses, strict=True)
            agree = f"max loss gap {max(abs(a - b) for a, b in gaps):.1e}"
        print(
            f"{name:29s} loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}  "
            f"{1e3 * run.seconds_per_step:6.1f} ms/step  {agree}"
        )
    return runs


if __name__ == "__main__":
    main()
