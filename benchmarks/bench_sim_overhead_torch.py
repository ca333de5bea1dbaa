"""Peer figure for bench_sim_overhead.py: one PyTorch training step (forward, backward, AdamW update)
of the same GPT-style stack on 8 simulated ranks (torch.distributed._local_tensor.LocalTensorMode,
fake process group, mesh data 2 x tensor 4, Megatron-style tensor parallel via parallelize_module,
data parallel by sharding the batch on "data" and averaging gradients over "data") divided by the
same step on a single device, both measured in this run on the same machine.

    python benchmarks/bench_sim_overhead_torch.py                 # 4 layers, hidden 768, seq 256, batch 8
    python benchmarks/bench_sim_overhead_torch.py --hidden 256 --heads 4 --seq 64 --layers 2   # quicker

torch is a benchmark-only dependency (pip install torch==2.13.0); it is not needed by mindspore_hyper.

Plan (same as bench_sim_overhead.strategy()):
  * blocks.*.attn.qkv, blocks.*.fc1      ColwiseParallel on "tensor"
  * blocks.*.attn.proj, blocks.*.fc2     RowwiseParallel on "tensor"
  * embed (token embedding)              RowwiseParallel on "tensor" (vocabulary-parallel embedding)
  * head (LM head)                       ColwiseParallel on "tensor", vocabulary-sharded logits fed to
                                         cross-entropy under loss_parallel()
  * pos, LayerNorms                      replicated on "tensor"
  * batch                                Shard(0) on "data" (distribute_tensor(..., [Shard(0),
                                         Replicate()]).to_local()), replicated on "tensor"
  * gradients                            DDP-style: dist.all_reduce(AVG) over the "data" group, one
                                         per parameter, between backward and the optimizer step
  * AdamW state                          NOT sharded on "data" (no ZeRO-1): every rank updates its
                                         whole tensor-parallel shard, so the simulated optimizer does
                                         2x the single-device optimizer work in total.
Why not FSDP2: fully_shard(mesh=mesh["data"]) on top of the TP plan does run its forward under
LocalTensorMode, but its backward fails (torch 2.13.0) in FSDPParam.free_unsharded_param ->
free_storage: "Attempted to call resize_() on an invalid python storage" (a LocalTensor is a
wrapper subclass without storage). FSDP1, DDP and replicate() were not tried; data parallelism is
expressed directly with the c10d all-reduce that LocalTensorMode simulates.
The fused qkv projection uses the Megatron head-interleaved output layout ([heads, 3, head_dim]),
so a column shard holds whole heads (q, k and v of heads/4 heads) and attention needs no
communication; the single-device model uses the identical module code and weights.

Prints the median of --repeat timed steps after one warm-up step for each, the ratio, and the
difference between the simulated and the single-device loss at every step (same initial weights,
same data, same optimizer).
"""
import copy
import math
import statistics
import sys
import time

from gpt_args import gpt_argument_parser

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    import torch.nn.functional as F
except ImportError:  # torch is a benchmark-only dependency
    sys.exit("bench_sim_overhead_torch.py needs PyTorch, which mindspore_hyper does not depend on.\n"
             "Install it into this environment with:  pip install torch==2.13.0")

try:
    from torch.distributed._local_tensor import LocalTensorMode, maybe_disable_local_tensor_mode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                   parallelize_module)
except ImportError as exc:
    sys.exit(f"this torch ({torch.__version__}) lacks what the benchmark needs ({exc}); "
             "install the version it was written for:  pip install torch==2.13.0")

MESH_SHAPE, MESH_NAMES = (2, 4), ("data", "tensor")
WORLD = MESH_SHAPE[0] * MESH_SHAPE[1]


# ---------------------------------------------------------------- model (mirrors examples/models.py)
class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        # Fused qkv; output features laid out [heads, 3, head_dim] (Megatron), see module docstring.
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x, mask):
        b, t, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)  # heads on this rank (all heads single-device)
        qkv = qkv.view(b, t, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)  # 3, b, heads, t, hd
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        ctx = torch.matmul(torch.softmax(scores, -1), v)
        return self.proj(ctx.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        # MindSpore defaults: LayerNorm epsilon 1e-7, GELU with the tanh approximation
        self.ln1 = nn.LayerNorm(hidden, eps=1e-7)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-7)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden, eps=1e-7)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e9), 1), persistent=False)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, ids, labels):
        x = self.embed(ids) + self.pos(self.positions)
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# ---------------------------------------------------------------- timing
def make_optimizer(model):
    # = mindspore nn.AdamWeightDecay(params, learning_rate=1e-4) defaults (eps 1e-6, weight_decay 0)
    return torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.0)


def time_steps(step, repeat):
    times, losses = [], []
    for i in range(repeat + 1):
        start = time.perf_counter()
        loss = step()
        if i:  # the first step is warm-up
            times.append(time.perf_counter() - start)
        losses.append(loss)
    return statistics.median(times), times, losses


def single_device_step(model, ids, labels):
    opt = make_optimizer(model)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def global_loss(loss, mesh):
    """Mean over the data-parallel ranks of the per-rank (local-batch mean) losses: the global
    batch mean, read off the LocalTensor shards after timing; also checks that the ranks of each
    tensor-parallel group agree."""
    local = loss.to_local() if isinstance(loss, DTensor) else loss
    shards = {r: t.item() for r, t in local._local_tensors.items()}
    ranks = mesh.mesh.tolist()  # [[data0 ranks...], [data1 ranks...]]
    per_data = []
    for row in ranks:
        vals = [shards[r] for r in row]
        if max(vals) - min(vals) > 1e-5 * max(1.0, abs(vals[0])):
            raise RuntimeError(f"tensor-parallel replicas disagree on the loss: {vals}")
        per_data.append(vals[0])
    return sum(per_data) / len(per_data)


def main():
    args = gpt_argument_parser(__doc__.splitlines()[0]).parse_args()
    dp, tp = MESH_SHAPE
    if args.heads % tp or args.vocab % tp or args.batch % dp or args.hidden % args.heads:
        sys.exit(f"need heads and vocab divisible by {tp}, batch by {dp}, hidden by heads")

    torch.manual_seed(0)
    cfg = dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)

    single = GPT(**cfg)
    initial = copy.deepcopy(single.state_dict())  # identical initial weights for the simulated run

    # ---- single device
    base, base_all, base_losses = time_steps(single_device_step(single, ids, labels), args.repeat)

    # ---- simulated: 8 ranks in this process
    dist.init_process_group("fake", rank=0, world_size=WORLD)
    with maybe_disable_local_tensor_mode():
        mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=MESH_NAMES)
    tp_mesh, dp_group = mesh["tensor"], mesh.get_group("data")
    with LocalTensorMode(frozenset(range(WORLD))):
        # Built inside the mode (as torch's LocalTensor tests do), so every parameter is a
        # LocalTensor holding one copy per rank; then loaded with the single-device initial weights.
        model = GPT(**cfg)
        model.load_state_dict(initial)
        for block in model.blocks:
            parallelize_module(block, tp_mesh, {
                "attn.qkv": ColwiseParallel(),
                "attn.proj": RowwiseParallel(),
                "fc1": ColwiseParallel(),
                "fc2": RowwiseParallel(),
            })
        parallelize_module(model, tp_mesh, {
            "embed": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        })
        # batch Shard(0) on "data", replicated on "tensor"; each rank's module sees its local half
        ids_local = distribute_tensor(ids, mesh, [Shard(0), Replicate()]).to_local()
        labels_local = distribute_tensor(labels, mesh, [Shard(0), Replicate()]).to_local()
        params = list(model.parameters())
        plan = {name: (tuple(p.placements), tuple(p.to_local().shape)) for name, p in model.named_parameters()
                if isinstance(p, DTensor)}
        opt = make_optimizer(model)

        def sim_step():
            opt.zero_grad(set_to_none=True)
            with loss_parallel():
                loss = model(ids_local, labels_local)
                loss.backward()
            # data parallel (DDP-style): average every gradient over the "data" group
            for p in params:
                grad = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=dp_group)
            opt.step()
            return loss.detach()

        sim, sim_all, sim_losses = time_steps(sim_step, args.repeat)
        sim_losses = [global_loss(l, mesh) for l in sim_losses]
    dist.destroy_process_group()

    diffs = [abs(a - b) for a, b in zip(sim_losses, base_losses)]
    print(f"torch {torch.__version__}, torch.get_num_threads() = {torch.get_num_threads()}")
    print(f"model: GPT {cfg}, batch {args.batch}; mesh data 2 x tensor 4 (8 LocalTensor ranks, fake PG)")
    print("tensor-parallel parameters (blocks.0 shown; placements on 'tensor', local shape):")
    for name, (placements, shape) in plan.items():
        if not name.startswith("blocks.") or name.startswith("blocks.0."):
            print(f"    {name}: {placements} {shape}")
    print("timed: forward + backward + AdamW step in both runs (simulated: TP via parallelize_module, "
          "loss_parallel cross-entropy, batch Shard(0) on 'data' + per-parameter gradient all_reduce(AVG) "
          "on 'data'; AdamW state not sharded on 'data')")
    print(f"single-device step: median {base:.3f} s  (all: {', '.join(f'{t:.3f}' for t in base_all)})")
    print(f"simulated step:     median {sim:.3f} s  (all: {', '.join(f'{t:.3f}' for t in sim_all)})")
    print(f"ratio simulated / single-device: {sim / base:.2f}x")
    print(f"loss single-device: {', '.join(f'{l:.6f}' for l in base_losses)}")
    print(f"loss simulated:     {', '.join(f'{l:.6f}' for l in sim_losses)}")
    print(f"|simulated - single-device| loss: step 0 (same weights) {diffs[0]:.3e}, "
          f"max over all {len(diffs)} steps {max(diffs):.3e}")


if __name__ == "__main__":
    main()
