"""Distributed-mode argument checks that need no msrun (a plain process is a job of one), and the
point-to-point message type."""
import numpy as np
import pytest

from mindspore_hyper.multimodal import AsyncEncoderPipeline
from mindspore_hyper.multimodal.request_transport import FEATURES, StageMessage
from mm_models import make_models


def test_split_needs_enough_processes():
    encoder, lm = make_models()
    with pytest.raises(ValueError, match=r"outside the job of 1 processes: launch msrun with --worker_num >= 2"):
        AsyncEncoderPipeline(encoder, lm, mode="distributed")


def test_split_ranks_must_be_distinct_and_match_num_encoders():
    encoder, lm = make_models()
    with pytest.raises(ValueError, match="must be distinct"):
        AsyncEncoderPipeline(encoder, lm, mode="distributed", encoder_ranks=[0], lm_rank=0)
    with pytest.raises(ValueError, match="2 ranks given for num_encoders=1"):
        AsyncEncoderPipeline(encoder, lm, mode="distributed", encoder_ranks=[0, 1], lm_rank=2)
    with pytest.raises(ValueError, match="cost_model"):
        AsyncEncoderPipeline(encoder, lm, mode="distributed", cost_model=lambda *a: 1.0)


def test_message_checks_and_normalises():
    m = StageMessage(FEATURES, 3, [1, 2], [0.5], np.ones((2, 3), np.float64))
    assert m.ids.dtype == np.int64 and m.values.dtype == np.float64 and m.array.dtype == np.float32
    assert m.kind_name == "features"
    with pytest.raises(ValueError, match="kind"):
        StageMessage(99)
    with pytest.raises(ValueError, match="at most 8 dimensions"):
        StageMessage(FEATURES, 0, array=np.zeros((1,) * 9))


def test_channel_carries_messages_in_order_with_and_without_array():
    import uuid

    from mindspore_hyper.multimodal.request_transport import DONE, END, Channel

    job = "mm" + uuid.uuid4().hex[:10]
    sender = Channel(job, 0, 1, me=0, timeout=10.0)  # returns at once; the receiving end waits for it
    receiver = Channel(job, 0, 1, me=1, timeout=10.0)
    sent = [StageMessage(FEATURES, 3, [1, 2, -1], [0.5, 1.5], np.arange(6).reshape(2, 3)), StageMessage(DONE, 4),
            StageMessage(END)]
    for m in sent:
        sender.send(m)
    for want in sent:
        got = receiver.recv()
        assert (got.kind, got.batch_id) == (want.kind, want.batch_id)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.values, want.values)
        assert (got.array is None) == (want.array is None)
        if want.array is not None:
            assert got.array.dtype == np.float32
            np.testing.assert_array_equal(got.array, want.array)
    sender.close()
    receiver.close()
