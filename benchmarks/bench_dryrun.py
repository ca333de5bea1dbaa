"""Dry-run benchmark: cluster-scale jobs from the model's own code, in seconds on a laptop.

Each case runs in a fresh process (`--case`) so its wall time and peak host memory (ru_maxrss)
are its own. Cases (sequence 4096, ZeRO-1 over the data axis; `--precision bf16`, the default:
bfloat16 compute with float32 master weights and Adam states, LayerNorms float32, pipeline stages
balanced by each layer's forward FLOPs (`layer_flops`); `fp32`: float32 throughout, stages
balanced by parameter count, the figures before; attention materialises its scores either way):
- dense / dense-pp: a Qwen3-32B-sized dense model (the examples' GPT block at 64 layers, hidden
  5120, 64 heads, vocabulary 151936; its MLP is GELU with FFN 4 x hidden = 20480, not Qwen3's
  SwiGLU 25600) on 128 devices: tensor 8 x data 16, and the goal's tensor 8 x pipeline 4 x data 4
  (1F1B, 8 microbatches);
- moe / moe-pp: DeepSeek-V3 as published (`examples/moe_lm.py`'s `deepseek_v3()`: 61 layers,
  hidden 7168, 128 heads of multi-head latent attention with q_lora_rank 1536, kv_lora_rank 512,
  qk_nope 128, qk_rope 64, value 128; the first 3 layers dense with a SwiGLU MLP of 18432, the
  other 58 MoE with 256 routed experts of FFN 2048 top-8 plus one shared expert; vocabulary
  129280; 671.0 B parameters, printed) on 2048 devices: experts 64 x data 32, and the goal's
  pipeline 16 x experts 64 x data 2 (1F1B, 16 microbatches);
- scaling: the dense model's wall time and host memory against devices (8 -> 2048, data-parallel
  size growing) and depth (4 -> 61 layers).
The baseline printed beside each is what the same job's numeric simulation would hold in this
process (every device's values): the ratio to the dry run's host peak is why the dry run exists.
"wall" is the dry run itself (model build, training step, report, prediction); "process" adds
Python's and MindSpore's start-up.

    .venv/bin/python benchmarks/bench_dryrun.py [--quick]
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))


SEQ = 4096


def layer_flops(case, layers):
    """Forward FLOPs per token of each pipeline layer (embedding, blocks, head), the cost the
    stages are balanced by: 2 x the parameters a token passes through (for MoE layers the shared
    and top-8 routed experts only, with the router) plus the attention's score and value
    products over all SEQ keys (the model computes them in full: 2 s heads (d_qk + d_v))."""
    if case == "dense":
        h, vocab = 5120, 151936
        block = 2 * 12 * h * h + 2 * SEQ * 2 * h
        return [2.0 * h] + [float(block)] * layers + [2.0 * h * vocab]
    from moe_lm import deepseek_v3

    c = deepseek_v3(layers=layers, seq=SEQ)
    h, m, heads = c["hidden"], c["mla"], c["heads"]
    qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    projections = (h * m["q_lora_rank"] + m["q_lora_rank"] * heads * qk + h * (m["kv_lora_rank"] + m["qk_rope_head_dim"])
                   + m["kv_lora_rank"] * heads * (m["qk_nope_head_dim"] + m["v_head_dim"]) + heads * m["v_head_dim"] * h)
    attention = 2 * projections + 2 * SEQ * heads * (qk + m["v_head_dim"])
    dense = attention + 2 * 3 * h * c["dense_ffn"]
    moe = attention + 2 * (3 * h * c["expert_ffn"] * c["top_k"] + 3 * h * c["shared_ffn"] + h * c["experts"])
    return [2.0 * h] + [float(dense if i < c["dense_layers"] else moe) for i in range(layers)] + [2.0 * h * c["vocab"]]


def to_bfloat16(net):
    """bfloat16 compute with float32 master weights and Adam states: every Cell computes in
    bfloat16 (`Cell.to_float`, MindSpore's kernel launch casts its float inputs, the float32
    Parameters too), LayerNorms in float32 as amp O2 keeps them, the cross-entropy in float32.
    (`amp.auto_mixed_precision`'s O2 wraps the model in a Cell without `pipeline_layers`, which a
    dry-run pipeline needs.)"""
    import mindspore as ms
    from mindspore import nn

    net.to_float(ms.bfloat16)
    for _, cell in net.cells_and_names():
        if isinstance(cell, (nn.LayerNorm, nn.CrossEntropyLoss)):  # the loss on float32 logits (the models cast)
            cell.to_float(ms.float32)
    return net


def build(case, layers, data, pipeline, precision):
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindspore.nn.utils import no_init_parameters

    import mindspore_hyper as mh
    from mindspore_hyper.pipeline.stages import balanced_split

    ms.set_context(mode=ms.PYNATIVE_MODE)
    microbatches = {1: 1, 4: 8, 16: 16}[pipeline]
    options = {"pipeline": {"schedule": "1f1b", "microbatches": microbatches}} if pipeline > 1 else {}
    if pipeline > 1 and precision == "bf16":  # the stages balanced by compute, not by parameters
        options["pipeline"]["layers_per_stage"] = balanced_split(layer_flops(case, layers), pipeline)
    cast = to_bfloat16 if precision == "bf16" else (lambda net: net)
    if case == "dense":
        from dryrun_llm import megatron
        from models import GPT, PipelinedGPT

        tensor = 8
        mh.set_context(mode="dryrun", device_num=data * tensor * pipeline)
        with no_init_parameters():
            gpt = PipelinedGPT if pipeline > 1 else GPT
            net = cast(gpt(vocab=151936, hidden=5120, heads=64, layers=layers, seq=SEQ))
            model = mh.auto_parallelize(net, megatron(data, tensor, True, pipeline), **options)
            opt = nn.AdamWeightDecay(model.optimizer_parameters(), 1e-4)
        ids = Tensor(np.zeros((data * microbatches, SEQ), np.int32))
        return model, opt, (ids, ids)
    from moe_lm import MoELM, deepseek_v3, moe_strategy

    experts = 64
    mh.set_context(mode="dryrun", device_num=data * experts * pipeline)
    with no_init_parameters():
        net = cast(MoELM(**deepseek_v3(layers=layers, seq=SEQ)))
        model = mh.auto_parallelize(net, moe_strategy(data, experts, pipeline), **options)
        opt = nn.AdamWeightDecay(model.optimizer_parameters(), 1e-4)
    ids = Tensor(np.zeros((data * experts * microbatches, SEQ), np.int32))
    return model, opt, (ids, ids)


def run_case(case, layers, data, pipeline, hardware, precision):
    from mindspore_hyper.cli.dryrun import add_predictions
    from mindspore_hyper.estimate.hardware import load_hardware
    from mindspore_hyper.hyper_parallel.report import session_report

    start = time.perf_counter()
    model, opt, inputs = build(case, layers, data, pipeline, precision)
    parameters = sum(math.prod(p.shape) for p in model.network.get_parameters())  # from shapes: none is made
    model.train_step(opt, *inputs)
    report = session_report("dryrun", model.mesh.size)
    add_predictions(report, load_hardware(hardware))
    wall = time.perf_counter() - start
    mesh = report["meshes"][0]
    row = max(mesh["memory_per_device"], key=lambda r: r["total"])  # the fullest device
    out = {"case": case, "precision": precision, "layers": layers, "devices": model.mesh.size,
           "mesh": dict(zip(mesh["dim_names"], mesh["shape"])),
           "parameters": parameters, "wall_s": wall, "host_peak_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "memory": row, "split": list(getattr(model, "split", ())),
           "distinct_programs": len(mesh["memory_per_device"]),
           "held_all": sum(r["total"] * _count(r["devices"]) for r in mesh["memory_per_device"]),
           "comm_bytes_per_device": sum(c["send_bytes_per_device"] for c in mesh["collectives"]),
           "comm_by_axis": {}, "predicted": mesh["predicted"]}
    for c in mesh["collectives"]:
        out["comm_by_axis"][c["axis"]] = out["comm_by_axis"].get(c["axis"], 0) + c["send_bytes_per_device"]
    print("RESULT " + json.dumps(out), flush=True)


def _count(label: str) -> int:
    """Devices of a memory row's label: "0-63,1024-1087 (128)" or "5"."""
    return int(label.rsplit("(", 1)[1].rstrip(")")) if "(" in label else 1


def spawn(case, layers, data, hardware, pipeline=1, precision="bf16"):
    cmd = [sys.executable, __file__, "--case", case, "--layers", str(layers), "--data", str(data),
           "--pipeline", str(pipeline), "--hardware", hardware, "--precision", precision]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    process_s = time.perf_counter() - start
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]), process_s=process_s)
    raise RuntimeError(f"{case} failed:\n{done.stderr[-4000:]}")


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def show(r):
    m = r["memory"]
    p = r["predicted"]
    print(f"{r['case']:5} {r['precision']} layers {r['layers']:2} ({r['parameters'] / 1e9:.1f} B parameters) pipeline "
          f"{r['mesh'].get('pipeline', 1):2} on {r['devices']:4} devices {r['mesh']}: wall {r['wall_s']:.1f} s "
          f"(whole process with Python and MindSpore start-up {r['process_s']:.1f} s), "
          f"host peak {r['host_peak_MiB']:.0f} MiB, {r['distinct_programs']} distinct device program(s)")
    working = f", bfloat16 working weights {gib(m['working_weights'])}" if "working_weights" in m else ""
    print(f"      the fullest device: parameters {gib(m['parameters'])}, gradients {gib(m['gradients'])}, optimizer "
          f"{gib(m['optimizer_states'])}{working}, peak activations {gib(m['activations_peak'])}, "
          f"total {gib(m['total'])}")
    print(f"      collectives sent per device per step: " +
          ", ".join(f"{a} {gib(b)}" for a, b in r["comm_by_axis"].items()))
    print(f"      predicted step on {p['hardware']}: {p['step_seconds']:.2f} s without overlap "
          f"({p['compute_seconds']:.2f} s compute + {p['comm_seconds']:.2f} s collectives), "
          f"{p['overlapped_seconds']:.2f} s fully overlapped")
    if r.get("split"):
        print(f"      layers per stage (embedding and head included): {r['split']}")
    held = r["held_all"]
    print(f"      baseline: a numeric simulation of this job holds every device's values in one process: "
          f"{held / 2**40:.1f} TiB (ratio to the dry run's host peak: {held / (r['host_peak_MiB'] * 2**20):.0f}x)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("dense", "moe"))
    p.add_argument("--layers", type=int)
    p.add_argument("--data", type=int)
    p.add_argument("--pipeline", type=int, default=1)
    p.add_argument("--hardware", default="ascend-910c")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: bfloat16 compute, float32 master weights and Adam states, pipeline stages balanced "
                        "by compute (what a real run uses); fp32: float32 throughout, stages by parameter count")
    p.add_argument("--quick", action="store_true", help="the two goal cases only")
    args = p.parse_args()
    if args.case:
        run_case(args.case, args.layers, args.data, args.pipeline, args.hardware, args.precision)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    show(spawn("dense", 64, 4, args.hardware, pipeline=4))
    show(spawn("moe", 61, 2, args.hardware, pipeline=16))
    show(spawn("moe", 61, 2, args.hardware, pipeline=16, precision="fp32"))  # the former figures, for comparison
    show(spawn("dense", 64, 16, args.hardware))
    show(spawn("moe", 61, 32, args.hardware))
    if args.quick:
        return
    print("\nscaling: dense model, wall time and host memory against devices (tensor 8, data growing) and depth")
    for data in (1, 4, 16, 64, 256):
        r = spawn("dense", 8, data, args.hardware)
        print(f"  devices {r['devices']:5}  layers  8: wall {r['wall_s']:6.1f} s (process {r['process_s']:5.1f} s)  "
              f"host peak {r['host_peak_MiB']:6.0f} MiB")
    for layers in (4, 16, 32, 61):
        r = spawn("dense", layers, 16, args.hardware)
        print(f"  devices {r['devices']:5}  layers {layers:2}: wall {r['wall_s']:6.1f} s (process {r['process_s']:5.1f} s)  "
              f"host peak {r['host_peak_MiB']:6.0f} MiB")


if __name__ == "__main__":
    main()
