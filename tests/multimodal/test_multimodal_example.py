"""examples/multimodal_pipeline.py runs (simulation) and passes its own per-request checks."""
import os
import subprocess
import sys

from paths import REPO_ROOT


def test_multimodal_example_runs_and_checks_itself():
    script = os.path.join(str(REPO_ROOT), "examples", "multimodal_pipeline.py")
    result = subprocess.run([sys.executable, script, "--batches", "3", "--batch-size", "2", "--duplicates", "0.5"],
                            capture_output=True, text=True, timeout=600, cwd=str(REPO_ROOT))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "OK: async and cached outputs match the synchronous run per request; no false reuse" in result.stdout
    assert "false reuse 0" in result.stdout


def test_qwen_vl_shaped_model_trains_like_the_synchronous_model():
    """MindSpore's own layers (Conv2d, TransformerEncoderLayer, MultiheadAttention, Embedding) through
    the pipeline: gradients of a 2-batch step equal value_and_grad over the whole model."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from paths import EXAMPLES
    sys.path.insert(0, str(EXAMPLES))
    from multimodal_pipeline import build_models, request_stream

    from mindspore_hyper.multimodal import AsyncEncoderPipeline, Batch

    stream = request_stream(num_batches=2, batch_size=2, side=16, variance=0.0, duplicate_share=0.0, text_len=3)
    rng = np.random.default_rng(0)
    batches = [Batch(b.batch_id, b.request_ids, b.images, b.text, rng.integers(0, 64, b.size).astype(np.int32))
               for b in stream.batches]
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    encoder, lm = build_models(seed=1)
    pipe = AsyncEncoderPipeline(encoder, lm, ahead=1, mode="simulation",
                                cost_model=lambda kind, batch, rows: 3.0 if batch.batch_id == 0 else 1.0)
    result = pipe.train_step(batches, loss)

    def total(*_):
        losses = [loss(lm(encoder(ms.Tensor(b.images)), ms.Tensor(b.text)), ms.Tensor(b.labels)) for b in batches]
        return losses[0] + losses[1]

    ref_loss, ref_grads = ms.value_and_grad(total, grad_position=None, weights=pipe.parameters())()
    assert abs(result.loss - float(ref_loss.asnumpy())) <= 1e-5 * abs(float(ref_loss.asnumpy()))
    assert len(result.grads) == len(ref_grads) > 20
    for p, g, r in zip(pipe.parameters(), result.grads, ref_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)
