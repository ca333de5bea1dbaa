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
  * AdamW state                          NOT sharded on "data" (no ZeRO-1): every one of the 8 ranks
                                         updates its whole tensor-parallel shard: 2x one device's
                                         element-updates for the tensor-sharded parameters, 8x for the
                                         replicated ones (pos, LayerNorms, row-parallel biases); the
                                         script counts them (`element_updates`).
Why not FSDP2: fully_shard(mesh=mesh["data"]) on top of the TP plan does run its forward under
LocalTensorMode, but its backward fails (torch 2.13.0) in FSDPParam.free_unsharded_param ->
free_storage: "Attempted to call resize_() on an invalid python storage" (a LocalTensor is a
wrapper subclass without storage). FSDP1, DDP and replicate() were not tried; data parallelism is
expressed directly with the c10d all-reduce that LocalTensorMode simulates.
The fused qkv projection uses the Megatron head-interleaved output layout ([heads, 3, head_dim]),
so a column shard holds whole heads (q, k and v of heads/4 heads) and attention needs no
communication; the single-device model uses the identical module code and weights.

Both models start from the same numpy weights (gpt_args.initial_weights, also what
bench_sim_overhead.py loads into MindSpore) and train on the same batch (gpt_args.token_batch).
Prints the median of --repeat timed steps after one warm-up step for each, the ratio, the
optimizer element-updates each side performs per step, and the simulated vs single-device loss
at every step, asserted equal within gpt_args.loss_tolerance (exit status 1 otherwise).
`--json PATH` also writes the result (bench_sim_overhead.py reads it); `--sim-first` times the
simulated step before the single-device one (the driver alternates the order between runs).
"""
import json
import math
import statistics
import sys
import time

from gpt_args import (compare_losses, gpt_argument_parser, initial_weights, load_average, loss_tolerance, token_batch,
                      torch_name)

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


def load_weights(model: nn.Module, weights: dict) -> None:
    """Load gpt_args.initial_weights (MindSpore names, numpy) into the torch GPT (every
    parameter, strictly: a missing or extra name raises)."""
    model.load_state_dict({torch_name(k): torch.from_numpy(v.copy()) for k, v in weights.items()}, strict=True)


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


def global_loss(loss, mesh, tolerance: float):
    """Mean over the data-parallel ranks of the per-rank (local-batch mean) losses: the global
    batch mean, read off the LocalTensor shards after timing; also checks that the ranks of each
    tensor-parallel group agree (to `tolerance`, relative: they hold the same all-reduced value)."""
    local = loss.to_local() if isinstance(loss, DTensor) else loss
    shards = {r: t.item() for r, t in local._local_tensors.items()}
    ranks = mesh.mesh.tolist()  # [[data0 ranks...], [data1 ranks...]]
    per_data = []
    for row in ranks:
        vals = [shards[r] for r in row]
        if max(vals) - min(vals) > tolerance * max(1.0, abs(vals[0])):
            raise RuntimeError(f"tensor-parallel replicas disagree on the loss: {vals}")
        per_data.append(vals[0])
    return sum(per_data) / len(per_data)


def element_updates(model) -> dict:
    """Optimizer element-updates per step: of the LocalTensor run (every one of the WORLD ranks
    updates its whole local tensor-parallel shard: AdamW state not sharded on "data"), of a
    real 8-device job with ZeRO-1 on "data" (each rank updates 1/data of its shard), and of one
    device (every parameter element once)."""
    local = 0
    for p in model.parameters():
        shard = p.to_local() if isinstance(p, DTensor) else p
        local += math.prod(shard.shape)
    return {"torch_local_tensor": local * WORLD, "real_zero1_job": local * WORLD // MESH_SHAPE[0],
            "single_device": sum(math.prod(p.shape) for p in model.parameters())}


def parse_args(argv=None):
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    parser.add_argument("--sim-first", action="store_true", help="time the simulated step before the single-device one")
    return parser.parse_args(argv)


def measure(args) -> dict:
    """Both steps, timed in the order --sim-first asks; a JSON-able dict (see `main`)."""
    dp, tp = MESH_SHAPE
    if args.heads % tp or args.vocab % tp or args.batch % dp or args.hidden % args.heads:
        sys.exit(f"need heads and vocab divisible by {tp}, batch by {dp}, hidden by heads")
    cfg = dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)
    weights = initial_weights(**cfg)
    ids, labels = (torch.from_numpy(a.astype("int64")) for a in token_batch(args.vocab, args.batch, args.seq))
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cfg": cfg, "batch": args.batch,
              "order": "simulated first" if args.sim_first else "single first"}

    def single_run():
        single = GPT(**cfg)
        load_weights(single, weights)
        median, times, losses = time_steps(single_device_step(single, ids, labels), args.repeat)
        result["single"] = {"median": median, "times": times, "losses": losses}

    def simulated_run():
        result["simulated"] = simulated(args, cfg, weights, ids, labels, result)

    for run in ((simulated_run, single_run) if args.sim_first else (single_run, simulated_run)):
        run()
    result["loss_check"] = compare_losses("torch LocalTensor vs torch single device", result["simulated"]["losses"],
                                          result["single"]["losses"], cfg, args.batch)
    return result


def simulated(args, cfg, weights, ids, labels, result) -> dict:
    """The LocalTensor step timed (8 ranks in this process); records the plan and the
    optimizer element-updates in `result`."""
    dist.init_process_group("fake", rank=0, world_size=WORLD)
    with maybe_disable_local_tensor_mode():
        mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=MESH_NAMES)
    tp_mesh, dp_group = mesh["tensor"], mesh.get_group("data")
    with LocalTensorMode(frozenset(range(WORLD))):
        # Built inside the mode (as torch's LocalTensor tests do), so every parameter is a
        # LocalTensor holding one copy per rank; then loaded with the shared initial weights.
        model = GPT(**cfg)
        load_weights(model, weights)
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
        result["plan"] = {name: [str(tuple(p.placements)), list(p.to_local().shape)]
                          for name, p in model.named_parameters() if isinstance(p, DTensor)}
        result["element_updates"] = element_updates(model)
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

        median, times, losses = time_steps(sim_step, args.repeat)
        tolerance = loss_tolerance(batch=args.batch, step=0, **cfg)
        losses = [global_loss(l, mesh, tolerance) for l in losses]
    dist.destroy_process_group()
    return {"median": median, "times": times, "losses": losses}


def main():
    args = parse_args()
    load_start = load_average()
    result = measure(args)
    result["load"] = [load_start, load_average()]
    base, sim = result["single"], result["simulated"]
    updates = result["element_updates"]
    print(f"torch {torch.__version__}, torch.get_num_threads() = {result['threads']}; "
          f"1-min load average {result['load'][0]:.2f} at start, {result['load'][1]:.2f} at end")
    print(f"model: GPT {result['cfg']}, batch {args.batch}; mesh data 2 x tensor 4 (8 LocalTensor ranks, fake PG); "
          f"timed {result['order']}")
    print("tensor-parallel parameters (blocks.0 shown; placements on 'tensor', local shape):")
    for name, (placements, shape) in result["plan"].items():
        if not name.startswith("blocks.") or name.startswith("blocks.0."):
            print(f"    {name}: {placements} {tuple(shape)}")
    print("timed: forward + backward + AdamW step in both runs (simulated: TP via parallelize_module, "
          "loss_parallel cross-entropy, batch Shard(0) on 'data' + per-parameter gradient all_reduce(AVG) "
          "on 'data'; AdamW state not sharded on 'data')")
    print(f"optimizer element-updates per step: LocalTensor {updates['torch_local_tensor']:,} "
          f"({updates['torch_local_tensor'] / updates['single_device']:.2f}x one device's "
          f"{updates['single_device']:,}); a real 8-device ZeRO-1 job {updates['real_zero1_job']:,}")
    print(f"single-device step: median {base['median']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in base['times'])})")
    print(f"simulated step:     median {sim['median']:.3f} s  (all: {', '.join(f'{t:.3f}' for t in sim['times'])})")
    print(f"ratio simulated / single-device: {sim['median'] / base['median']:.2f}x")
    print(f"loss single-device: {', '.join(f'{l:.6f}' for l in base['losses'])}")
    print(f"loss simulated:     {', '.join(f'{l:.6f}' for l in sim['losses'])}")
    check = result["loss_check"]
    print(f"|simulated - single-device| / single-device loss: max {check['max_relative']:.2e} over "
          f"{len(check['relative'])} steps (tolerance {check['tolerance'][0]:.1e} at step 0, growing by that "
          f"per step: gpt_args.loss_tolerance) -> {'equal' if check['ok'] else 'NOT EQUAL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not check["ok"]:
        sys.exit("loss check failed: the simulated losses differ from the single-device ones beyond the tolerance")


if __name__ == "__main__":
    main()
