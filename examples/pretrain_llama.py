"""Pre-train a small Llama-style model with the training essentials, checked against one device.

A Llama-style decoder (RMSNorm, causal attention, SwiGLU MLP; no rotary embedding) trained data x
tensor parallel with ZeRO-1 (float32, or with `--dtype fp16` float16 compute in the decoder layers
on float32 master weights with a dynamic loss scale), gradient clipping to a global norm of 1.0,
4 accumulated micro-batches per step, the resumable sharded loader over a token file the script
writes itself, a checkpoint (with the loader's position) every `--save-every` steps, and step
telemetry. The same steps on
one device (the same casts, clipping, accumulation and data) give the reference losses.

    .venv/bin/python examples/pretrain_llama.py --steps 20                 # 4 simulated devices, checked
    .venv/bin/python examples/pretrain_llama.py --steps 10 --save-every 5 --ckpt /tmp/ckpt
    .venv/bin/python examples/pretrain_llama.py --steps 10 --devices 2 --resume /tmp/ckpt   # at another size
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=4 --local_worker_num=4 \\
        --master_port=8131 --log_dir=msrun_log --join=True examples/pretrain_llama.py --steps 20 --no-check

Mixed precision: `--dtype fp16` runs the decoder layers in float16 on float32 master weights
with a dynamic loss scale (`Cell.to_float`), the RMSNorms, the head and the loss in float32 as
the recipes keep them (in float16, MindSpore 2.10's CPU RsqrtGrad kernel overflows on the norm's
small variances and every gradient of the embedding is NaN: docs/training.md, "Mixed
precision"); it matches float32 training to float16's tolerance
(tests/examples/test_pretrain_llama_precision.py). The default is float32. bfloat16
(`--dtype bf16`, the recipes' choice) has no MindSpore 2.10 CPU kernels for MatMul, Softmax or the
norms: on the CPU the script sets `cpu_bfloat16="emulate"`, which runs those ops on float32 copies
with bfloat16 outputs (docs/training.md, "CPU kernels and dtypes"); no loss scale (bfloat16 has
float32's exponent range).
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, amp, nn, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.data import ShardedLoader, TokenFile  # noqa: E402
from mindspore_hyper.train import Telemetry  # noqa: E402

VOCAB, HIDDEN, HEADS, FFN, LAYERS, SEQ = 256, 64, 4, 128, 2, 32


class RMSNorm(nn.Cell):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight


class Attention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Dense(HIDDEN, HIDDEN, has_bias=False), nn.Dense(HIDDEN, HIDDEN, has_bias=False)
        self.v, self.o = nn.Dense(HIDDEN, HIDDEN, has_bias=False), nn.Dense(HIDDEN, HIDDEN, has_bias=False)

    def construct(self, x, mask):
        b, t, h = x.shape
        d = h // HEADS

        def heads(y):
            return y.reshape(b, t, HEADS, d).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(d) + mask
        ctx = ops.matmul(ops.softmax(scores, -1), v)
        return self.o(ctx.transpose(0, 2, 1, 3).reshape(b, t, h))


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(HIDDEN), Attention()
        self.mlp_norm = RMSNorm(HIDDEN)
        self.gate, self.up = nn.Dense(HIDDEN, FFN, has_bias=False), nn.Dense(HIDDEN, FFN, has_bias=False)
        self.down = nn.Dense(FFN, HIDDEN, has_bias=False)

    def construct(self, x, mask):
        x = x + self.attn(self.attn_norm(x), mask)
        y = self.mlp_norm(x)
        return x + self.down(ops.silu(self.gate(y)) * self.up(y))


class Llama(nn.Cell):
    """Returns the mean next-token cross-entropy of `ids` against `labels`."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.CellList([Block() for _ in range(LAYERS)])
        self.norm, self.head = RMSNorm(HIDDEN), nn.Dense(HIDDEN, VOCAB, has_bias=False)
        self.mask = Tensor(np.triu(np.full((SEQ, SEQ), -1e4, np.float32), 1))

    def construct(self, ids, labels):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, self.mask.astype(x.dtype))
        logits = self.head(self.norm(x)).astype(ms.float32)
        return ops.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def build(dtype: str):
    """The model (seeded): its decoder layers compute in `dtype` on float32 master weights
    (`Cell.to_float`: each layer casts its inputs and weights when it runs); the embedding, the
    RMSNorms (their inputs cast to float32), the head and the loss stay float32, as the recipes
    keep them. A float16 norm fails: the backward of its rsqrt overflows (module docstring)."""
    ms.set_seed(0)
    model = Llama()
    if dtype != "fp32":
        for layer in model.layers:
            layer.to_float(ms.float16 if dtype == "fp16" else ms.bfloat16)
            for norm in (layer.attn_norm, layer.mlp_norm):
                norm.to_float(ms.float32)
        model.norm.to_float(ms.float32)
    return model


U32 = 2.0 ** -24  # unit roundoff of float32
LOW_PRECISION_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def loss_rtol(dtype: str, steps: int, batch: int, tensor: int = 1, against_fp32: bool = False) -> np.ndarray:
    """Relative tolerances of the losses of `steps` training steps between two runs that compute the
    same mathematics in another rounding, derived from the computation (tests/tolerances.py's
    first-order model; no machine's rounding measured):

    - a float32 reduction of K terms is within gamma_K = K u / (1 - K u) of its sum of |terms| in
      any order (Higham, eq. 3.5); K is the longest one of a step: the global batch's tokens
      (`batch` x SEQ, summed in every weight gradient: 16 x 32 = 512), longer than the vocabulary's
      log-sum-exp (256) and every fan-in (at most FFN = 128);
    - float16 (`dtype="fp16"`, u16 = 2^-11; bfloat16 the same with 2^-8): a split contraction's
      `tensor` partial sums are each rounded to float16 and added in float16 where one device
      rounds the whole sum once: (tensor + 1) u16 per layer (the kernels accumulate wider than
      float16 and round once: MindSpore's CPU MatMul and ReduceSum sum 4096 float16 ones to 4096);
      `against_fp32`: float16 against float32, each matmul's input, weight and output rounded to
      float16: 3 u16 per layer;
    - a step passes each layer's error through the forward product, the two backward products
      and the all-reduce (4 times), and the update carries a relative gradient error into the
      parameters at most as large (AdamW's step is normalised; clipping scales by the norm, within
      the same relative error): the loss of step s (its forward after s - 1 updates) within
      4 s (per-layer error).

    A real error (a wrong shard, a missing gradient sum, a repeated or skipped batch) changes a
    loss by O(1e-2) relative (the loss moves by several percent a step): above every float32 bound
    of a 20-step run (2.4e-3 at step 20); float16's are looser (6e-3 at step 1, 12% at step 20).

    Returns:
        One relative tolerance per step, increasing.
    """
    per_layer = U32 * batch * SEQ / (1 - U32 * batch * SEQ)
    if dtype in LOW_PRECISION_ROUNDOFF:
        per_layer += (3 if against_fp32 else (tensor + 1 if tensor > 1 else 0)) * LOW_PRECISION_ROUNDOFF[dtype]
    elif dtype != "fp32":
        raise ValueError(f"dtype={dtype!r}: expected 'fp32', 'fp16' or 'bf16'")
    return 4 * np.arange(1, steps + 1) * per_layer


def strategy(devices: int):
    """data x tensor (Megatron's split of attention and MLP), ZeRO-1 over data."""
    tensor = 2 if devices % 2 == 0 and devices > 1 else 1
    mesh = mh.Layout((devices // tensor, tensor), ("data", "tensor"))
    s = mesh(tensor_map=(), optimizer_state="data" if devices // tensor > 1 else None)
    for name in ("q", "k", "v"):
        s.override(f"*.attn.{name}.weight", "tensor")
    s.override("*.attn.o.weight", None, "tensor")
    s.override("*.gate.weight", "tensor").override("*.up.weight", "tensor").override("*.down.weight", None, "tensor")
    return s


def write_tokens(path: str, count: int = 200_000) -> None:
    """A token stream with structure to learn (a noisy repeating pattern), uint16."""
    rng = np.random.RandomState(0)
    base = np.tile(np.arange(VOCAB, dtype=np.int64), count // VOCAB + 1)[:count]
    noise = rng.randint(0, VOCAB, count)
    tokens = np.where(rng.rand(count) < 0.2, noise, base).astype(np.uint16)
    tokens.tofile(path)


def train(args, devices, resume=None):
    """Train `args.steps` steps on `devices` devices (1: the single-device reference run through the
    same wrapper); returns the losses and the number of steps the loss scaler skipped."""
    mh.set_context(device_num=devices)
    if args.dtype == "bf16" and ms.get_context("device_target") == "CPU":
        mh.set_context(cpu_bfloat16="emulate")  # MindSpore's CPU kernels lack bfloat16 MatMul, Softmax, ...
    model = mh.auto_parallelize(build(args.dtype), strategy(devices))
    optimizer = nn.AdamWeightDecay(model.optimizer_parameters(), learning_rate=3e-3, weight_decay=0.01)
    loader = ShardedLoader(TokenFile(args.tokens, seq_len=SEQ), global_batch=args.batch, model=model, seed=0)
    scaler = amp.DynamicLossScaler(scale_value=2.0 ** 10, scale_factor=2, scale_window=50) \
        if args.dtype == "fp16" else None
    first = 0
    if resume:
        mh.load_checkpoint(model, resume, optimizer=optimizer, extra_state={"data": loader})
        first = loader.consumed // args.batch
    telemetry = Telemetry(log_every=args.log_every, total_steps=first + args.steps)  # steps numbered from the run's start
    losses_out, skipped = [], 0
    for step in range(first, first + args.steps):
        ids, labels = next(loader)
        loss = model.train_step(optimizer, ids, labels, max_grad_norm=1.0, accumulation_steps=4, loss_scale=scaler)
        losses_out.append(float(loss.asnumpy()))
        skipped += model.last_step_skipped
        telemetry.step(model, loss, tokens=args.batch * SEQ, step=step)
        if args.ckpt and args.save_every and (step + 1) % args.save_every == 0:
            mh.save_checkpoint(model, args.ckpt, optimizer=optimizer, step=step + 1, extra_state={"data": loader})
    return losses_out, skipped


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences), 4 micro-batches of it")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="the decoder layers' compute dtype (fp16 with a dynamic loss scale; bf16 emulated on the "
                        "CPU: see the module docstring)")
    p.add_argument("--tokens", help="token file (written if missing; default: a temporary file)")
    p.add_argument("--ckpt", help="checkpoint folder")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--resume", help="resume from this checkpoint folder (its newest step)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--no-check", action="store_true", help="skip the single-device reference run")
    args = p.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    args.tokens = args.tokens or os.path.join(tempfile.gettempdir(), "pretrain_llama_tokens.bin")
    if not os.path.exists(args.tokens):
        write_tokens(args.tokens)
    parallel, skipped = train(args, args.devices, args.resume)
    print("parallel losses:", " ".join(f"{x:.7f}" for x in parallel))
    if args.dtype == "fp16":
        print(f"steps skipped by the loss scaler: {skipped} of {len(parallel)}")
    if args.no_check or mh.get_context("mode") != "simulation":
        return
    ckpt, args.ckpt = args.ckpt, None  # the reference run saves nothing
    reference, _ = train(args, 1, args.resume)
    args.ckpt = ckpt
    print("one-device losses:", " ".join(f"{x:.7f}" for x in reference))
    if not (np.isfinite(parallel).all() and np.isfinite(reference).all()):
        raise SystemExit(f"a loss is not finite: parallel {parallel}, one device {reference}")
    # the parallel run sums in another order (and, in float16, rounds the tensor-parallel partial
    # sums): loss_rtol derives the bound
    tensor = 2 if args.devices % 2 == 0 and args.devices > 1 else 1
    rtol = loss_rtol(args.dtype, len(parallel), args.batch, tensor)
    bad = np.abs(np.subtract(parallel, reference)) > rtol * np.abs(reference)
    if bad.any():
        raise SystemExit(f"steps {list(np.flatnonzero(bad) + 1)} differ from one device beyond the derived "
                         f"tolerance {rtol[bad]}: parallel {parallel}, one device {reference}")
    print(f"OK: {len(parallel)} steps on {args.devices} devices match one device; loss "
          f"{parallel[0]:.3f} -> {parallel[-1]:.3f}")


if __name__ == "__main__":
    main()
