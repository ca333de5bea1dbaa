"""A Qwen-VL-shaped model at CPU scale served through the asynchronous encoder pipeline.

Vision encoder (ViT: patch convolution, 2-D sin-cos positions, transformer layers) + Qwen-VL's
adapter (learned queries cross-attending to the ViT output: a fixed number of visual tokens) run on
the encoder group; a small decoder LM (causal transformer over visual tokens + text) on the LM
group. The request stream varies the image resolution per batch so encoder time varies about
+-30%, and a share of the images are near-duplicates (re-encoded, shifted, resized copies of
earlier ones). The script runs the stream synchronously, through the async pipeline, and through
the async pipeline with the LSH feature cache, checks per-request outputs, and prints the figures.

    .venv/bin/python examples/multimodal_pipeline.py                      # simulation (default)
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=2 --local_worker_num=2 \\
        --master_port=8129 --log_dir=msrun_log --join=True examples/multimodal_pipeline.py
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List

import mindspore as ms
import numpy as np
from mindspore import nn, ops

import mindspore_hyper as mh
from mindspore_hyper.multimodal import AsyncEncoderPipeline, Batch, FeatureCache, signature_dim
from mindspore_hyper.multimodal.synthetic import random_image, reencode, shift


# ----- model -------------------------------------------------------------------------------------
def sincos_2d(rows: int, cols: int, dim: int) -> np.ndarray:
    """(rows * cols, dim) fixed 2-D sine-cosine positions (any resolution, like an interpolated table)."""
    quarter = dim // 4
    freqs = 1.0 / (10000 ** (np.arange(quarter) / quarter))
    y, x = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    parts = [np.sin(np.outer(y.ravel(), freqs)), np.cos(np.outer(y.ravel(), freqs)),
             np.sin(np.outer(x.ravel(), freqs)), np.cos(np.outer(x.ravel(), freqs))]
    return np.concatenate(parts, axis=1).astype(np.float32)


class VisionEncoder(nn.Cell):
    """ViT + Qwen-VL adapter: (B, 3, H, W) -> (B, queries, lm_width)."""

    def __init__(self, patch=4, width=48, layers=2, heads=4, queries=8, lm_width=48):
        super().__init__()
        self.patch, self.width = patch, width
        self.embed = nn.Conv2d(3, width, patch, stride=patch, pad_mode="valid", has_bias=True)
        self.blocks = nn.CellList([nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                                              batch_first=True, norm_first=True)
                                   for _ in range(layers)])
        self.norm = nn.LayerNorm((width,))
        self.queries = ms.Parameter(ms.Tensor(np.random.default_rng(0).normal(0, 0.02, (queries, width))
                                              .astype(np.float32)), name="queries")
        self.resampler = nn.MultiheadAttention(width, heads, batch_first=True)
        self.out = nn.Dense(width, lm_width)
        self._positions = {}

    def construct(self, images):
        b, _, h, w = images.shape
        x = self.embed(images)  # (B, width, h/p, w/p)
        rows, cols = h // self.patch, w // self.patch
        x = x.reshape(b, self.width, rows * cols).transpose(0, 2, 1)
        key = (rows, cols)
        if key not in self._positions:
            self._positions[key] = ms.Tensor(sincos_2d(rows, cols, self.width))
        x = x + self._positions[key]
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        q = ops.broadcast_to(self.queries.expand_dims(0), (b,) + self.queries.shape)
        pooled = self.resampler(q, x, x, need_weights=False)[0]
        return self.out(pooled)


class DecoderLM(nn.Cell):
    """Causal decoder over [visual tokens, text]: returns next-token logits (B, vocab)."""

    def __init__(self, vocab=64, width=48, layers=2, heads=4, max_len=32):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.CellList([nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                                              batch_first=True, norm_first=True)
                                   for _ in range(layers)])
        self.norm = nn.LayerNorm((width,))
        self.head = nn.Dense(width, vocab)
        self.max_len = max_len

    def construct(self, visual, text):
        h = ops.concat((visual, self.tokens(text)), axis=1)
        n = h.shape[1]
        h = h + self.positions(ms.Tensor(np.arange(n, dtype=np.int32)))
        mask = ms.Tensor(np.triu(np.full((n, n), -1e9, np.float32), 1))
        for block in self.blocks:
            h = block(h, src_mask=mask)
        return self.head(self.norm(h[:, -1]))


# ----- request stream ----------------------------------------------------------------------------
def resize(image: np.ndarray, side: int) -> np.ndarray:
    """Bilinear resize of a (C, H, W) image to side x side."""
    c, h, w = image.shape
    ys = np.clip((np.arange(side) + 0.5) * h / side - 0.5, 0, h - 1)
    xs = np.clip((np.arange(side) + 0.5) * w / side - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = image[:, y0][:, :, x0] * (1 - fx) + image[:, y0][:, :, x1] * fx
    bottom = image[:, y1][:, :, x0] * (1 - fx) + image[:, y1][:, :, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


@dataclass
class Stream:
    batches: List[Batch]
    sources: dict  # request id -> scene id (near-duplicates share their original's scene)
    duplicates: set  # request ids that are near-duplicates of an earlier request


def request_stream(num_batches=12, batch_size=4, side=32, variance=0.3, duplicate_share=0.3, text_len=6,
                   vocab=64, patch=4, seed=0) -> Stream:
    """Batches whose resolution varies so that the patch count (encoder work) varies +-`variance`,
    with a `duplicate_share` of near-duplicate images (re-encoded / shifted / resized copies)."""
    rng = np.random.default_rng(seed)
    base = (side // patch) ** 2
    lo = int(np.ceil(np.sqrt(base * (1 - variance)))) * patch
    hi = int(np.floor(np.sqrt(base * (1 + variance)))) * patch
    sides = np.arange(lo, hi + 1, patch)
    scenes, batches, sources, duplicates = [], [], {}, set()
    rid = 0
    for b in range(num_batches):
        s = int(rng.choice(sides))
        images = []
        for _ in range(batch_size):
            if scenes and rng.random() < duplicate_share:
                scene = int(rng.integers(len(scenes)))
                image = resize(scenes[scene], s)
                kind = rng.integers(3)
                image = reencode(image, rng, gain=rng.uniform(0.9, 1.1)) if kind == 0 else \
                    shift(image, int(rng.integers(-1, 2)), int(rng.integers(-1, 2))) if kind == 1 else image
                duplicates.add(rid)
            else:
                scene = len(scenes)
                scenes.append(random_image(rng, side, side))
                image = resize(scenes[scene], s)
            images.append(image)
            sources[rid] = scene
            rid += 1
        text = rng.integers(0, vocab, size=(batch_size, text_len)).astype(np.int32)
        batches.append(Batch(b, tuple(range(rid - batch_size, rid)), np.stack(images), text))
    return Stream(batches, sources, duplicates)


# ----- run ---------------------------------------------------------------------------------------
def build_models(seed=0):
    ms.set_seed(seed)
    return VisionEncoder(), DecoderLM()


def run_variants(stream: Stream, ahead=1, threshold=0.95, warmup=True, cost_model=None, models=None):
    """sync, async and async+cache over the same stream; returns {name: PipelineResult}.
    `cost_model` (simulation): priced instead of measured compute times."""
    encoder, lm = models or build_models()
    if warmup:  # first calls of each shape compile kernels; keep them out of the timings
        AsyncEncoderPipeline(encoder, lm, ahead=0).infer(stream.batches[:1] + [
            b for b in stream.batches if b.images.shape != stream.batches[0].images.shape][:3])
    results = {}
    for name, a, cache in (("sync", 0, None), ("async", ahead, None),
                           ("async+cache", ahead, FeatureCache(signature_dim(16), threshold=threshold))):
        results[name] = AsyncEncoderPipeline(encoder, lm, ahead=a, cache=cache, cost_model=cost_model).infer(stream.batches)
    return results


def check_and_report(stream: Stream, results) -> dict:
    """Per-request checks (raise on failure) and the figures."""
    sync, fast, cached = results["sync"], results["async"], results["async+cache"]
    ids = sorted(stream.sources)
    if sync.outputs.keys() != set(ids) or fast.outputs.keys() != set(ids) or cached.outputs.keys() != set(ids):
        raise AssertionError("a request is missing from the outputs")
    for rid in ids:
        np.testing.assert_allclose(fast.outputs[rid], sync.outputs[rid], rtol=1e-4, atol=1e-5)
        if rid not in cached.reused_from:
            np.testing.assert_allclose(cached.outputs[rid], sync.outputs[rid], rtol=1e-4, atol=1e-5)
    false_reuse = sum(stream.sources[r] != stream.sources[k] for r, k in cached.reused_from.items())
    found = sum(r in cached.reused_from for r in stream.duplicates)
    figures = {name: r.timeline.summary() for name, r in results.items()}
    encode = np.array([e.duration for e in sync.timeline.of(kind="encode")])
    return {"figures": figures, "false_reuse": false_reuse, "recall": found / max(1, len(stream.duplicates)),
            "duplicates": len(stream.duplicates), "hits": len(cached.reused_from),
            "encode_spread": (float(encode.min() / encode.mean() - 1), float(encode.max() / encode.mean() - 1))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--duplicates", type=float, default=0.3, help="share of near-duplicate images")
    parser.add_argument("--variance", type=float, default=0.3, help="+- share of encoder work variation")
    parser.add_argument("--ahead", type=int, default=1)
    parser.add_argument("--plot", metavar="PREFIX", help="write PREFIX_<variant>.png Gantt charts of the timelines")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    stream = request_stream(args.batches, args.batch_size, variance=args.variance, duplicate_share=args.duplicates)
    results = run_variants(stream, ahead=args.ahead)
    if mh.get_context("mode") == "distributed" and not results["sync"].outputs:
        return  # an encoder process: the LM process checks and reports
    report = check_and_report(stream, results)
    if args.plot:
        for name, result in results.items():
            result.timeline.plot(f"{args.plot}_{name.replace('+', '_')}.png", title=name)
    print(f"mode {mh.get_context('mode')}; encoder time per batch {report['encode_spread'][0]:+.0%} .. "
          f"{report['encode_spread'][1]:+.0%} of its mean")
    print(f"{'variant':<12} {'latency mean':>13} {'p99':>8} {'throughput':>12} {'overlap':>8}")
    for name, f in report["figures"].items():
        print(f"{name:<12} {f['latency_mean'] * 1e3:>10.1f} ms {f['latency_p99'] * 1e3:>5.1f} ms "
              f"{f['throughput']:>8.1f} r/s {f['overlap'] * 1e3:>5.0f} ms")
    print(f"cache: {report['hits']} reused of {report['duplicates']} near-duplicates "
          f"(recall {report['recall']:.0%}), false reuse {report['false_reuse']}")
    if report["false_reuse"]:
        raise SystemExit("a request was answered with another image's feature")
    print("OK: async and cached outputs match the synchronous run per request; no false reuse")


if __name__ == "__main__":
    main()
