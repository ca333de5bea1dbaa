"""Float32 tolerances derived from the computation, not from one machine's rounding.

Two float32 evaluations of the same mathematics differ by rounding only, but by how much depends on
the summation order (BLAS blocking, SIMD width, split-K partial sums then an all-reduce in the
simulation), which differs between CPUs and between a full parallel run and a file run alone. A
tolerance that merely covers what one machine produced fails on the next one; the bounds here hold
for every order:

* a length-K float32 reduction: |fl(sum_i a_i b_i) - sum_i a_i b_i| <= gamma_K * sum_i |a_i b_i|,
  gamma_K = K u / (1 - K u), u = 2**-24 (Higham, Accuracy and Stability of Numerical Algorithms,
  2nd ed., eq. 3.5 / 3.13), for any order of the additions;
* Adam divides each element's step by sqrt(v) + eps: an element whose gradient is at rounding-noise
  level moves by up to ~lr per step in a direction rounding decides, whatever the rest of the model
  does. Its parameters are compared with an absolute floor proportional to lr * steps (multi-step) or,
  after one step, with the exact propagation of the already-checked gradient error through Adam's
  first update.

A real bug (a wrong shard, a missing or doubled gradient sum, a lost step) gives O(1) relative
errors in the affected tensor, orders of magnitude above every bound here; each check keeps a
normwise or elementwise part that such a bug cannot pass.
"""
import numpy as np

U32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff of float32, 2**-24


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u): the relative bound of k float32 roundings in a row."""
    assert k * U32 < 1
    return k * U32 / (1 - k * U32)


# -- reductions -----------------------------------------------------------------------------------

def matmul_error_bound(a, b, evaluations: int = 1):
    """Elementwise bound on |x - a @ b| for x a float32 evaluation of a @ b in any summation order:
    gamma_K (|a| @ |b|), K = a.shape[-1] (products included). `evaluations=2` bounds the difference
    of two float32 evaluations (each within gamma_K of the exact product)."""
    a64, b64 = np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64))
    return evaluations * gamma(a64.shape[-1]) * (a64 @ b64)


def assert_matmul_close(got, a, b, err_msg: str = ""):
    """`got` (a float32 evaluation of a @ b, e.g. split over devices and summed) against the exact
    product computed in float64, elementwise within the float32 reduction bound."""
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    assert_within(got, want, matmul_error_bound(a, b), err_msg or "a @ b")


def assert_within(got, want, bound, err_msg: str = ""):
    """|got - want| <= bound elementwise (bound broadcasts), with the worst element in the message."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{err_msg}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    bad = ~(err <= bound)  # NaN fails too
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape) if err.ndim else ()
        raise AssertionError(f"{err_msg}: {int(bad.sum())} of {err.size} elements outside the bound; worst at "
                             f"{i}: got {got[i]!r}, want {want[i]!r}, |diff| {err[i]:.3g} > bound {bound[i]:.3g}")


def reduction_length(params, tokens: int = 0) -> int:
    """The longest float32 reduction of one training step of a model with these parameters: a
    weight's fan-in (the product of its trailing dimensions: a Dense row, a conv kernel) or fan-out
    (its first dimension, summed over in the input gradient), or the batch's `tokens` (samples x
    positions, summed over in a weight gradient)."""
    shapes = [tuple(p.shape) for p in params]
    return max([int(tokens)] + [max(s) for s in shapes if s] + [int(np.prod(s[1:])) for s in shapes if len(s) > 1])


def gradient_tolerance(reference_grads, reduction: int):
    """Per-tensor elementwise tolerances for gradients computed in another float32 order: relative
    training_rtol(reduction, 1) of each element plus the same of the largest gradient of the model
    (a gradient element is a signed sum whose cancellation leaves it no relative accuracy of its own;
    its terms are bounded by the gradient scale)."""
    rtol = training_rtol(reduction, 1)
    scale = max(float(np.abs(np.asarray(g)).max()) for g in reference_grads)
    return [rtol * np.abs(np.asarray(g, np.float64)) + rtol * scale for g in reference_grads]


# -- Adam -----------------------------------------------------------------------------------------

# Adam's own elementwise arithmetic (about a dozen float32 operations per element: the moments, the
# square root, the division, the bias corrections) evaluated by differently vectorised loops on the
# two sides: a relative difference of the update of at most 16 u.
ADAM_ARITHMETIC = 16 * U32


def adam_first_step_bound(grad, grad_error, lr: float, param=None, eps: float = 1e-8, beta2: float = 0.999):
    """Elementwise bound on the difference of the parameters after ONE MindSpore nn.Adam step taken
    with two gradients that differ by at most `grad_error` (elementwise, e.g. the tolerance the test
    has just asserted on the gradients). The first step moves each element by lr * f(g) with
    f(g) = g / (|g| + eps / sqrt(1 - beta2)) (bias-corrected moments; checked against nn.Adam), and
    f is increasing, so the difference is at most lr * max(f(g + d) - f(g), f(g) - f(g - d)). Where
    |g| >> d this is tiny (lr * d * eps' / g**2): a gradient near zero is what may move by up to lr.
    Plus the rounding of the update and of the parameter subtraction."""
    g = np.asarray(grad, np.float64)
    d = np.broadcast_to(np.asarray(grad_error, np.float64), g.shape)
    e = eps / np.sqrt(1 - beta2)

    def f(x):
        return x / (np.abs(x) + e)

    step = lr * np.maximum(f(g + d) - f(g), f(g) - f(g - d))
    rounding = lr * np.abs(f(g)) * ADAM_ARITHMETIC * 2
    if param is not None:
        rounding = rounding + 2 * U32 * np.abs(np.asarray(param, np.float64))
    return step + rounding


def momentum_first_step_bound(grad, grad_error, lr: float, param=None):
    """Elementwise bound on the parameter difference after ONE nn.Momentum step (p -= lr * g from
    zero moments, linear in g) taken with gradients `grad_error` apart, plus the roundings."""
    bound = lr * np.asarray(grad_error, np.float64) + 2 * U32 * lr * np.abs(np.asarray(grad, np.float64))
    if param is not None:
        bound = bound + 2 * U32 * np.abs(np.asarray(param, np.float64))
    return bound


def adam_displacement_bound(lr: float, steps: int, beta1: float = 0.9, beta2: float = 0.999) -> float:
    """The largest |difference| of one parameter element between two nn.Adam runs of `steps` steps,
    whatever their gradients: step t moves an element by lr_t |m_t| / (sqrt(v_t) + eps) with
    lr_t = lr sqrt(1 - beta2^t) / (1 - beta1^t), and by Cauchy-Schwarz
    |m_t| / sqrt(v_t) <= (1 - beta1) / sqrt(1 - beta2) * sqrt(sum_{j<t} (beta1^2 / beta2)^j), so each
    run moves it at most lr * c_t (c_t ~ 1.0 for the default betas) and two runs differ by at most
    2 lr sum_t c_t. This is what an element whose gradient is rounding noise may use up."""
    total = 0.0
    for t in range(1, steps + 1):
        ratio = (1 - beta1) / np.sqrt(1 - beta2) * np.sqrt(sum((beta1 ** 2 / beta2) ** j for j in range(t)))
        total += np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * ratio
    return 2 * lr * total


def training_rtol(reduction: int, steps: int) -> float:
    """Normwise relative bound on a trained float32 tensor (or a loss, or a gradient) between two
    evaluation orders: each step's gradient is built from length-`reduction` reductions (the longest
    one in the model: a layer's fan-in, or batch x tokens for a weight gradient), each within gamma_K
    relative of its sum of |terms| in any order; times 4 for the forward product, the two backward
    products and the all-reduce of a layer; Adam's and momentum's updates carry a relative gradient
    difference into the step at most as large, and `steps` steps add up. A first-order bound (a
    deep chain of layers multiplies it by the chain's conditioning, which these small test models
    keep near 1: the errors measured on the suite's models are 1e-4 to 1e-1 of it), far below the
    O(1) relative error of a wrong shard, a missing gradient sum or a lost step."""
    return 4 * steps * gamma(reduction)


def assert_adam_training_close(got, want, lr: float, steps: int, reduction: int, err_msg: str = "",
                               noise_only: bool = False):
    """Parameters after `steps` nn.Adam steps against the reference run:
    - normwise, ||got - want|| <= training_rtol(reduction, steps) * ||want|| (a wrong shard, a missing
      gradient sum or a lost step moves a whole tensor by O(1) of its update and fails this);
    - elementwise, |got - want| <= adam_displacement_bound(lr, steps) (noise-gradient elements).
    `noise_only`: a tensor whose exact gradient is 0 (an attention key bias: softmax ignores a shift
    of all scores), so every element is rounding noise that Adam turns into steps; only the
    elementwise bound applies."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert_within(got, want, adam_displacement_bound(lr, steps), err_msg)
    if noise_only:
        return
    rtol = training_rtol(reduction, steps)
    err, ref = np.linalg.norm(got - want), np.linalg.norm(want)
    assert err <= rtol * ref, f"{err_msg}: normwise ||got - want|| = {err:.3g} > {rtol:.3g} * ||want|| = {rtol * ref:.3g}"
