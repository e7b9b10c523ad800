"""The plain-torch references of `references.py`: by hand, and against the packages.

The package tests run where the package imports (`pip install -e '.[refs]'`) and
skip otherwise; the hand computations always run. Every comparison is float64 and
feeds both sides the same gradient at each step, taken at the package's parameters
on a small regression problem.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F
from references import (
    AdanState,
    adan_init,
    adan_step,
    ademamix_alpha,
    ademamix_beta3,
    ademamix_init,
    ademamix_step,
    mars_init,
    mars_step,
    merged_shape,
    schedule_free_adamw_eval_point,
    schedule_free_adamw_init,
    schedule_free_adamw_step,
    soap_init,
    soap_step,
)
from torch import Tensor, nn

DTYPE = torch.float64
STEPS = 25

S = TypeVar("S")

# The regression problem's parameters: a 3-4-3 tanh network and a 3-D tensor fitted
# by least squares, each step on a fresh minibatch (so that no two gradients are
# equal, which would leave SOAP's first rotated gradient zero, up to rounding, along
# the null directions of its factors). A test optimizes some of the parameters; the
# others stay at their start.
SHAPES: dict[str, tuple[int, ...]] = {
    "w1": (4, 3),
    "b1": (4,),
    "w2": (3, 4),
    "b2": (3,),
    "t": (2, 2, 3),
}
ALL = tuple(SHAPES)


def _draw(seed: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen, dtype=DTYPE) for k, s in shapes.items()}


START = {k: 0.5 * v for k, v in _draw(48, SHAPES).items()}
TEACHER = _draw(49, {"w": (3, 3), "t": (12,)})


def _batch(step: int) -> dict[str, Tensor]:
    """Step `step`'s minibatch: inputs and the teacher's noisy targets."""
    data = _draw(1000 + step, {"x": (16, 3), "a": (16, 12)})
    noise = _draw(2000 + step, {"y": (16, 3), "c": (16,)})
    data["y"] = data["x"] @ TEACHER["w"].T + 0.1 * noise["y"]
    data["c"] = data["a"] @ TEACHER["t"] + 0.1 * noise["c"]
    return data


def _start(names: Sequence[str]) -> list[Tensor]:
    return [START[n].clone() for n in names]


def _gradients(
    names: Sequence[str], values: Sequence[Tensor], step: int
) -> list[Tensor]:
    """The loss's gradients at `values` (the parameters `names`) on step's batch."""
    data = _batch(step)
    leaves = [v.detach().clone().requires_grad_() for v in values]
    p = {**START, **dict(zip(names, leaves))}
    hidden = torch.tanh(F.linear(data["x"], p["w1"], p["b1"]))
    fit = F.mse_loss(F.linear(hidden, p["w2"], p["b2"]), data["y"])
    residual = data["a"] @ p["t"].reshape(-1) - data["c"]
    return list(torch.autograd.grad(fit + 0.5 * residual.square().mean(), leaves))


def _where(label: str) -> Callable[[str], str]:
    return lambda message: f"{label}: {message}"


def _against(
    package: Callable[[list[nn.Parameter]], Any],
    reference: Callable[[list[Tensor], list[Tensor], S], tuple[list[Tensor], S]],
    state: S,
    names: Sequence[str] = ALL,
    *,
    rtol: float,
    atol: float,
    steps: int = STEPS,
) -> tuple[Any, list[nn.Parameter], list[Tensor], S]:
    """Step a package optimizer and a reference side by side, comparing each step."""
    leaves = [nn.Parameter(v) for v in _start(names)]
    opt = package(leaves)
    params = _start(names)
    for step in range(1, steps + 1):
        grads = _gradients(names, [leaf.detach() for leaf in leaves], step)
        for leaf, g in zip(leaves, grads):
            leaf.grad = g.clone()
        opt.step()
        params, state = reference(params, grads, state)
        for name, leaf, p in zip(names, leaves, params):
            torch.testing.assert_close(
                leaf.detach(),
                p,
                rtol=rtol,
                atol=atol,
                msg=_where(f"{name} after step {step}"),
            )
    return opt, leaves, params, state


# --------------------------------------------------------------------------------------
# Schedule-Free AdamW

SF: dict[str, Any] = {
    "lr": 0.01,
    "betas": (0.9, 0.999),
    "weight_decay": 0.1,
    "warmup_steps": 5,
    "r": 0.5,
    "weight_lr_power": 2.0,
}


@pytest.mark.parametrize(
    ("cls", "foreach", "paper"),
    [
        ("AdamWScheduleFree", True, False),
        ("AdamWScheduleFree", False, False),
        ("AdamWScheduleFreePaper", True, True),
    ],
)
def test_schedule_free_adamw_matches_schedulefree(
    cls: str, foreach: bool, paper: bool
) -> None:
    """y, z and the evaluation point x equal schedulefree's; same ops, same order."""
    schedulefree = pytest.importorskip(
        "schedulefree", reason="the `refs` extra installs schedulefree"
    )

    def package(leaves: list[nn.Parameter]) -> Any:
        opt = getattr(schedulefree, cls)(leaves, foreach=foreach, **SF)
        opt.train()
        return opt

    def reference(
        params: list[Tensor], grads: list[Tensor], state: Any
    ) -> tuple[list[Tensor], Any]:
        return schedule_free_adamw_step(
            params, grads, state, lr_bias_correction=paper, **SF
        )

    opt, leaves, params, state = _against(
        package, reference, schedule_free_adamw_init(_start(ALL)), rtol=0, atol=0
    )
    for leaf, z in zip(leaves, state.z):
        torch.testing.assert_close(opt.state[leaf]["z"], z, rtol=0, atol=0)
    opt.eval()
    x = schedule_free_adamw_eval_point(params, state, beta1=SF["betas"][0])
    for leaf, expected in zip(leaves, x):
        torch.testing.assert_close(leaf.detach(), expected, rtol=0, atol=0)


def test_schedule_free_adamw_intermittent_evaluation_matches_schedulefree() -> None:
    """Evaluating every 5 steps (eval, then train) agrees to the toggle's rounding.

    The package moves its parameters to x and back with two `lerp`s, which returns y
    only to a few ulps; the reference's x is computed from y and z and leaves them be.
    """
    schedulefree = pytest.importorskip(
        "schedulefree", reason="the `refs` extra installs schedulefree"
    )
    names = ALL
    leaves = [nn.Parameter(v) for v in _start(names)]
    opt = schedulefree.AdamWScheduleFree(leaves, **SF)
    opt.train()
    params = _start(names)
    state = schedule_free_adamw_init(params)
    for step in range(1, STEPS + 1):
        grads = _gradients(names, [leaf.detach() for leaf in leaves], step)
        for leaf, g in zip(leaves, grads):
            leaf.grad = g.clone()
        opt.step()
        params, state = schedule_free_adamw_step(params, grads, state, **SF)
        if step % 5 == 0:
            opt.eval()
            x = schedule_free_adamw_eval_point(params, state)
            for leaf, expected in zip(leaves, x):
                torch.testing.assert_close(
                    leaf.detach(), expected, rtol=1e-13, atol=1e-15
                )
            opt.train()


def test_schedule_free_adamw_first_steps_by_hand() -> None:
    """Three steps equal the paper's z, x, y recursion written out in floats."""
    lr, beta1, beta2, eps, decay, warmup, r = 0.1, 0.9, 0.999, 1e-8, 0.5, 2, 1.0
    theta, grads = 0.7, [0.3, -0.2, 0.05]
    z = x = y = theta
    v = weight_sum = 0.0
    ys, xs = [], []
    for k, g in enumerate(grads):
        lr_k = lr * min(1.0, (k + 1) / warmup)
        weight = (k + 1) ** r * lr_k**2  # lr_k never falls, so lr_max = lr_k
        weight_sum += weight
        c = weight / weight_sum
        v = beta2 * v + (1 - beta2) * g * g
        u = g / (math.sqrt(v / (1 - beta2 ** (k + 1))) + eps) + decay * y
        z = z - lr_k * u
        x = (1 - c) * x + c * z
        y = (1 - beta1) * z + beta1 * x
        ys.append(y)
        xs.append(x)

    params = [torch.tensor([theta], dtype=DTYPE)]
    state = schedule_free_adamw_init(params)
    for g, y_expected, x_expected in zip(grads, ys, xs):
        params, state = schedule_free_adamw_step(
            params,
            [torch.tensor([g], dtype=DTYPE)],
            state,
            lr=lr,
            betas=(beta1, beta2),
            eps=eps,
            weight_decay=decay,
            warmup_steps=warmup,
            r=r,
        )
        x_now = schedule_free_adamw_eval_point(params, state, beta1=beta1)
        torch.testing.assert_close(params[0].item(), y_expected, rtol=1e-14, atol=0)
        torch.testing.assert_close(x_now[0].item(), x_expected, rtol=1e-13, atol=0)


def test_schedule_free_adamw_eval_point_is_the_weighted_average_of_z() -> None:
    """After T steps, x = sum_t w_t z_t / sum_t w_t with w_t = t**r * lr_max_t**2."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.randn(3, 2, generator=gen, dtype=DTYPE)]
    state = schedule_free_adamw_init(params)
    zs, weights = [], []
    for k in range(12):
        grads = [torch.randn(3, 2, generator=gen, dtype=DTYPE)]
        params, state = schedule_free_adamw_step(
            params, grads, state, lr=0.05, warmup_steps=6, r=0.5, weight_decay=0.01
        )
        zs.append(state.z[0])
        weights.append((k + 1) ** 0.5 * state.lr_max**2)
    average = sum(w * z for w, z in zip(weights, zs)) / sum(weights)
    assert state.weight_sum == pytest.approx(sum(weights), rel=1e-15)
    x = schedule_free_adamw_eval_point(params, state)
    torch.testing.assert_close(x[0], average, rtol=1e-12, atol=1e-14)


def test_schedule_free_adamw_eval_point_starts_at_the_parameters() -> None:
    """Before any step, x = y = z."""
    params = [torch.randn(4, dtype=DTYPE)]
    x = schedule_free_adamw_eval_point(params, schedule_free_adamw_init(params))
    torch.testing.assert_close(x[0], params[0], rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# AdEMAMix

ADEMAMIX: dict[str, Any] = {
    "lr": 0.01,
    "betas": (0.9, 0.999, 0.9999),
    "alpha": 5.0,
    "t_alpha_beta3": 10,
    "weight_decay": 0.1,
}


@pytest.mark.parametrize("foreach", [True, False])
def test_ademamix_matches_pytorch_optimizer(foreach: bool) -> None:
    """Equal to pytorch_optimizer's AdEMAMix to a few ulps per step.

    It interpolates the averages with `lerp` and applies the decoupled decay as
    p * (1 - lr * decay) before an `addcdiv`, where the reference (the authors' code)
    scales and adds, and adds the decay to the update: the same values, rounded
    differently.
    """
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.AdEMAMix(leaves, weight_decouple=True, foreach=foreach, **ADEMAMIX)

    def reference(
        params: list[Tensor], grads: list[Tensor], state: Any
    ) -> tuple[list[Tensor], Any]:
        return ademamix_step(params, grads, state, **ADEMAMIX)

    _against(package, reference, ademamix_init(_start(ALL)), rtol=1e-12, atol=1e-14)


def test_ademamix_first_step_by_hand() -> None:
    """Step 1: p - lr * ((1 + alpha * (1 - beta3)) * g / (|g| + eps) + decay * p)."""
    lr, alpha, decay, eps = 0.01, 5.0, 0.1, 1e-8
    p = torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE)
    g = torch.tensor([0.3, 0.02, -4.0], dtype=DTYPE)
    (out,), state = ademamix_step(
        [p], [g], ademamix_init([p]), lr=lr, alpha=alpha, weight_decay=decay, eps=eps
    )
    expected = p - lr * ((1 + alpha * 1e-4) * g / (g.abs() + eps) + decay * p)
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=0)
    torch.testing.assert_close(state.exp_avg_slow[0], 1e-4 * g, rtol=1e-12, atol=0)


def test_ademamix_second_step_by_hand() -> None:
    """Step 2 of the averages and the bias-corrected fast one, without warm-up."""
    b1, b2, b3, alpha, lr = 0.9, 0.999, 0.9999, 2.0, 0.01
    p = torch.tensor([0.5, -1.0], dtype=DTYPE)
    g1 = torch.tensor([0.3, 0.02], dtype=DTYPE)
    g2 = torch.tensor([-0.1, 0.05], dtype=DTYPE)
    params, state = ademamix_step([p], [g1], ademamix_init([p]), lr=lr)
    (out,), _ = ademamix_step(params, [g2], state, lr=lr)
    m1 = b1 * (1 - b1) * g1 + (1 - b1) * g2
    m2 = b3 * (1 - b3) * g1 + (1 - b3) * g2
    v = b2 * (1 - b2) * g1**2 + (1 - b2) * g2**2
    step2 = (m1 / (1 - b1**2) + alpha * m2) / ((v / (1 - b2**2)).sqrt() + 1e-8)
    torch.testing.assert_close(out, params[0] - lr * step2, rtol=1e-13, atol=0)


def test_ademamix_warmup_schedules() -> None:
    """The warm-ups: alpha, and beta3's half-life from beta1's to beta3's, linear."""
    alpha, b1, b3, warmup = 8.0, 0.9, 0.9999, 100

    def half_life(beta: float) -> float:
        return math.log(0.5) / math.log(beta)

    for t in (1, 25, 50, 99, 100):
        assert ademamix_alpha(t, alpha, warmup) == pytest.approx(alpha * t / warmup)
        expected = (1 - t / warmup) * half_life(b1) + t / warmup * half_life(b3)
        beta3 = ademamix_beta3(t, b1, b3, warmup)
        assert half_life(beta3) == pytest.approx(expected, rel=1e-9)
        assert b1 < beta3 <= b3
    assert ademamix_beta3(100, b1, b3, warmup) == pytest.approx(b3, rel=1e-15)
    assert ademamix_alpha(250, alpha, warmup) == alpha
    assert ademamix_beta3(250, b1, b3, warmup) == b3
    assert ademamix_alpha(3, alpha, None) == alpha
    assert ademamix_beta3(3, b1, b3, None) == b3


# --------------------------------------------------------------------------------------
# SOAP

SOAP: dict[str, Any] = {"lr": 0.01, "betas": (0.95, 0.95), "weight_decay": 0.01}
SOAP_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "refresh every 5 steps": ({"precondition_frequency": 5}, ALL),
    "eigh basis only": ({"precondition_frequency": 100}, ALL),
    "1-D preconditioned": ({"precondition_frequency": 5, "precondition_1d": True}, ALL),
    "normalized": ({"precondition_frequency": 5, "normalize_grads": True}, ALL),
    "no bias correction": (
        {"precondition_frequency": 3, "correct_bias": False, "shampoo_beta": 0.9},
        ALL,
    ),
    # pytorch_optimizer cannot merge a tensor into a single dimension (a 1-D one
    # included): it reshapes it to [1]. Here w1 stays (4, 3) and t becomes (4, 3).
    "merged dims": (
        {"precondition_frequency": 5, "merge_dims": True, "max_precond_dim": 4},
        ("w1", "w2", "t"),
    ),
    "dims over the maximum": (
        {"precondition_frequency": 5, "max_precond_dim": 3},
        ALL,
    ),
}


@pytest.mark.parametrize("case", list(SOAP_CASES))
def test_soap_matches_pytorch_optimizer(case: str) -> None:
    """Equal to pytorch_optimizer's SOAP to rounding, its float32 QR mirrored.

    pytorch_optimizer computes the QR of the power iteration in float32 (the authors'
    code computes both eigh and QR in float32), so the reference runs with
    `qr_dtype=torch.float32`; the rest differs in rounding only (`lerp` for the
    averages, decay as p * (1 - lr * decay), the eigenvalue estimate as a column sum).
    `normalized` runs with eps 1e-30, the constant the reference (the authors')
    adds to the RMS, where pytorch_optimizer adds eps.
    """
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )
    options, names = SOAP_CASES[case]
    options = {**SOAP, **options}
    if options.get("normalize_grads"):
        options["eps"] = 1e-30
    renamed = {"max_precond_dim": "max_precondition_dim"}
    renamed["normalize_grads"] = "normalize_gradient"
    theirs = {renamed.get(k, k): v for k, v in options.items()}

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.SOAP(leaves, **theirs)

    def reference(
        params: list[Tensor], grads: list[Tensor], state: Any
    ) -> tuple[list[Tensor], Any]:
        return soap_step(params, grads, state, qr_dtype=torch.float32, **options)

    _against(
        package, reference, soap_init(_start(names)), names, rtol=1e-10, atol=1e-12
    )


def _orthonormal_eigenvectors(m: Tensor) -> Tensor:
    vectors: Tensor = torch.linalg.eigh(m).eigenvectors
    return vectors


def test_soap_first_call_builds_the_factors_and_takes_no_step() -> None:
    """The first gradient only sets GG = (1 - b) G G^T, G^T G and their eigenbases."""
    gen = torch.Generator().manual_seed(2)
    p = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    g = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    (out,), state = soap_step([p], [g], soap_init([p]), shampoo_beta=0.8)
    torch.testing.assert_close(out, p, rtol=0, atol=0)
    assert state.step == 0
    assert state.gg is not None
    assert state.q is not None
    left, right = state.gg[0]
    q_left, q_right = state.q[0]
    assert left is not None
    assert right is not None
    assert q_left is not None
    assert q_right is not None
    torch.testing.assert_close(left, 0.2 * g @ g.T, rtol=1e-14, atol=1e-16)
    torch.testing.assert_close(right, 0.2 * g.T @ g, rtol=1e-14, atol=1e-16)
    for factor, basis in ((left, q_left), (right, q_right)):
        eigenvalues = torch.diag(basis.T @ factor @ basis)
        torch.testing.assert_close(basis.T @ factor @ basis, torch.diag(eigenvalues))
        assert bool((eigenvalues[:-1] >= eigenvalues[1:]).all())


def test_soap_first_step_is_the_sign_in_the_eigenbasis() -> None:
    """Step 1 with eps 0: p - lr * Q_L sign(Q_L^T g Q_R) Q_R^T, Q from the 1st grad."""
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    g0 = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    g1 = torch.randn(3, 2, generator=gen, dtype=DTYPE)
    lr = 0.1
    state = soap_init([p])
    params, state = soap_step([p], [g0], state, lr=lr, eps=0.0, weight_decay=0.0)
    (out,), _ = soap_step(params, [g1], state, lr=lr, eps=0.0, weight_decay=0.0)
    q_left = _orthonormal_eigenvectors(g0 @ g0.T)
    q_right = _orthonormal_eigenvectors(g0.T @ g0)
    expected = p - lr * q_left @ torch.sign(q_left.T @ g1 @ q_right) @ q_right.T
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-14)


def test_soap_unpreconditioned_vector_takes_adams_steps_one_late() -> None:
    """A 1-D tensor (no precondition_1d) follows torch.optim.AdamW from the 2nd call.

    eps is 0: SOAP adds eps to sqrt(v) before the bias correction, Adam after it.
    """
    gen = torch.Generator().manual_seed(4)
    p = torch.randn(5, generator=gen, dtype=DTYPE)
    grads = [torch.randn(5, generator=gen, dtype=DTYPE) for _ in range(8)]
    lr, betas, decay = 0.05, (0.9, 0.99), 0.1
    params, state = [p], soap_init([p])
    for g in grads:
        params, state = soap_step(
            params, [g], state, lr=lr, betas=betas, eps=0.0, weight_decay=decay
        )
    leaf = nn.Parameter(p.clone())
    # SOAP's decay comes after the update: AdamW's before it, on the same factor.
    adam = torch.optim.Adam([leaf], lr=lr, betas=betas, eps=0.0)
    with torch.no_grad():
        for g in grads[1:]:
            leaf.grad = g.clone()
            adam.step()
            leaf.mul_(1 - lr * decay)
    torch.testing.assert_close(params[0], leaf.detach(), rtol=1e-13, atol=1e-15)


def test_soap_bases_stay_orthonormal_through_refreshes() -> None:
    """Every Q is orthonormal after 12 steps with a refresh every 2."""
    names = ("w1", "t")
    params = _start(names)
    state = soap_init(params)
    for step in range(1, 13):
        params, state = soap_step(
            params, _gradients(names, params, step), state, precondition_frequency=2
        )
    assert state.q is not None
    for bases in state.q:
        for q in bases:
            assert q is not None
            eye = torch.eye(q.shape[0], dtype=DTYPE)
            torch.testing.assert_close(q.T @ q, eye, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    ("shape", "bound", "merged"),
    [
        ((4, 3), 4, [4, 3]),
        ((2, 2, 3), 4, [4, 3]),
        ((4, 3), 10000, [12]),
        ((20, 3), 10, [20, 3]),
        ((3, 20), 10, [3, 20]),
        ((1, 5, 1, 2), 10, [10]),
        ((64, 3, 3, 3), 100, [64, 27]),
    ],
)
def test_merged_shape(shape: tuple[int, ...], bound: int, merged: list[int]) -> None:
    """Neighbouring dimensions merge while the product stays within the bound."""
    assert merged_shape(shape, bound) == merged


# --------------------------------------------------------------------------------------
# Adan

ADAN: dict[str, Any] = {"lr": 0.01, "betas": (0.98, 0.92, 0.99), "weight_decay": 0.1}


@pytest.mark.parametrize("no_prox", [False, True])
@pytest.mark.parametrize("foreach", [True, False])
def test_adan_matches_pytorch_optimizer(no_prox: bool, foreach: bool) -> None:
    """Equal to pytorch_optimizer's Adan to a few ulps per step.

    It interpolates m and the difference average with `lerp` where the reference (the
    authors' code) scales and adds: the same values, rounded differently.
    `weight_decouple` is its name for `no_prox`.
    """
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.Adan(leaves, weight_decouple=no_prox, foreach=foreach, **ADAN)

    def reference(
        params: list[Tensor], grads: list[Tensor], state: AdanState
    ) -> tuple[list[Tensor], AdanState]:
        return adan_step(params, grads, state, no_prox=no_prox, **ADAN)

    _against(package, reference, adan_init(_start(ALL)), rtol=1e-12, atol=1e-14)


def test_adan_first_two_steps_by_hand() -> None:
    """Steps 1 and 2 written out, with the proximal decay."""
    b1, b2, b3, lr, decay, eps = 0.98, 0.92, 0.99, 0.01, 0.1, 1e-8
    p0 = torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE)
    g1 = torch.tensor([0.3, 0.02, -4.0], dtype=DTYPE)
    g2 = torch.tensor([-0.1, 0.05, -3.0], dtype=DTYPE)
    state = adan_init([p0])
    (p1,), state = adan_step([p0], [g1], state, lr=lr, weight_decay=decay)
    # No difference yet: m / (1 - b1) = g1 and n / (1 - b3) = g1 ** 2.
    expected1 = (p0 - lr * g1 / (g1.abs() + eps)) / (1 + lr * decay)
    torch.testing.assert_close(p1, expected1, rtol=1e-14, atol=0)

    (p2,), _ = adan_step([p1], [g2], state, lr=lr, weight_decay=decay)
    d = g2 - g1
    m = b1 * (1 - b1) * g1 + (1 - b1) * g2
    dm = (1 - b2) * d
    n = b3 * (1 - b3) * g1**2 + (1 - b3) * (g2 + b2 * d) ** 2
    denom = (n / (1 - b3**2)).sqrt() + eps
    update = m / (1 - b1**2) + b2 * dm / (1 - b2**2)
    expected2 = (p1 - lr * update / denom) / (1 + lr * decay)
    torch.testing.assert_close(p2, expected2, rtol=1e-13, atol=0)


def test_adan_decoupled_decay_comes_first() -> None:
    """With no_prox, step 1 is p * (1 - lr * decay) - lr * g / (|g| + eps)."""
    lr, decay = 0.01, 0.3
    p = torch.tensor([0.5, -1.0], dtype=DTYPE)
    g = torch.tensor([0.3, -2.0], dtype=DTYPE)
    (out,), _ = adan_step(
        [p], [g], adan_init([p]), lr=lr, weight_decay=decay, no_prox=True
    )
    expected = p * (1 - lr * decay) - lr * g / (g.abs() + 1e-8)
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=0)


# --------------------------------------------------------------------------------------
# MARS

MARS: dict[str, Any] = {
    "lr": 0.01,
    "betas": (0.95, 0.99),
    "weight_decay": 0.1,
    "gamma": 0.025,
    "lr_1d": 0.005,
    "betas_1d": (0.9, 0.95),
    "weight_decay_1d": 0.1,
    "eps": 0.0,
}
MARS_CASES: dict[str, dict[str, Any]] = {
    "adamw": {},
    "lion": {"mars_type": "lion"},
    "every tensor": {"optimize_1d": True},
}


@pytest.mark.parametrize("case", list(MARS_CASES))
@pytest.mark.parametrize("foreach", [True, False])
def test_mars_matches_pytorch_optimizer(case: str, foreach: bool) -> None:
    """Equal to pytorch_optimizer's MARS to 1e-8, with eps 0 and no 3-D tensor.

    pytorch_optimizer adds 1e-15 to v under the root, which moves a coordinate's
    step by up to lr * 1e-15 / (2 v), and the parameters by up to 3e-11 here (a
    coordinate with a small v would move more). It also adds eps before the bias
    correction where the authors add it after (eps 0 removes that difference), and
    runs tensors of 3 or more dimensions through MARS where the authors' code (and
    the reference) gives them AdamW; the problem here leaves its 3-D tensor out.
    """
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )
    options = {**MARS, **MARS_CASES[case]}
    names = ("w1", "b1", "w2", "b2")

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.MARS(leaves, foreach=foreach, **options)

    def reference(
        params: list[Tensor], grads: list[Tensor], state: Any
    ) -> tuple[list[Tensor], Any]:
        return mars_step(params, grads, state, **options)

    _against(package, reference, mars_init(_start(names)), names, rtol=1e-8, atol=1e-10)


def test_mars_first_step_by_hand() -> None:
    """Step 1: matrices by c / (|c| + eps), the others (3-D too) by AdamW's at lr_1d.

    c is g (1 + gamma b1 / (1 - b1)), divided by its norm when that is above 1.
    """
    lr, lr_1d, gamma, b1, decay, decay_1d, eps = (
        0.01,
        0.004,
        0.025,
        0.95,
        0.2,
        0.1,
        1e-8,
    )
    gen = torch.Generator().manual_seed(5)
    params = [
        torch.randn(s, generator=gen, dtype=DTYPE) for s in [(3, 2), (3,), (2, 1, 2)]
    ]
    grads = [
        torch.randn(s, generator=gen, dtype=DTYPE) for s in [(3, 2), (3,), (2, 1, 2)]
    ]
    out, _ = mars_step(
        params,
        grads,
        mars_init(params),
        lr=lr,
        lr_1d=lr_1d,
        gamma=gamma,
        betas=(b1, 0.99),
        weight_decay=decay,
        weight_decay_1d=decay_1d,
        eps=eps,
    )
    c = grads[0] * (1 + gamma * b1 / (1 - b1))
    c = c / max(1.0, c.norm().item())
    expected = params[0] - lr * (decay * params[0] + c / (c.abs() + eps))
    torch.testing.assert_close(out[0], expected, rtol=1e-13, atol=0)
    for p, g, moved in zip(params[1:], grads[1:], out[1:]):
        adamw = p - lr_1d * (decay_1d * p + g / (g.abs() + eps))
        torch.testing.assert_close(moved, adamw, rtol=1e-13, atol=0)


def test_mars_second_step_by_hand() -> None:
    """Step 2 of a matrix: the correction gamma b1 / (1 - b1) (g2 - g1), unclipped."""
    lr, gamma, b1, b2, eps = 0.01, 0.025, 0.95, 0.99, 1e-8
    p = torch.tensor([[0.5, -1.0], [0.25, 2.0]], dtype=DTYPE)
    g1 = torch.tensor([[0.03, 0.02], [-0.04, 0.01]], dtype=DTYPE)
    g2 = torch.tensor([[0.01, -0.03], [-0.05, 0.02]], dtype=DTYPE)
    params, state = mars_step([p], [g1], mars_init([p]), lr=lr, eps=eps)
    (out,), _ = mars_step(params, [g2], state, lr=lr, eps=eps)
    k = gamma * b1 / (1 - b1)
    c1, c2 = g1 * (1 + k), g2 + k * (g2 - g1)
    assert c1.norm() < 1
    assert c2.norm() < 1
    m = b1 * (1 - b1) * c1 + (1 - b1) * c2
    v = b2 * (1 - b2) * c1**2 + (1 - b2) * c2**2
    denom = ((v / (1 - b2**2)).sqrt() + eps) * (1 - b1**2)
    torch.testing.assert_close(out, params[0] - lr * m / denom, rtol=1e-13, atol=0)
