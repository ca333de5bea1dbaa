"""Step telemetry (mindspore_hyper.train): every figure equals what it is computed from: tokens/s
from the step's seconds, MFU against the hand formula, FLOPs per token against the 6N + attention
count, memory and communication against the model's own StepReport, the progress bar's line,
and the SummaryRecord scalars read back from the event file."""
import glob
import io
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from mindspore_hyper.estimate import TransformerConfig, load_hardware
from mindspore_hyper.train import ProgressBar, Telemetry


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def fake_report():
    memory = {0: {"total": 1000}, 1: {"total": 3000}}
    comm = {"AllReduce": {"data": {"count": 2, "bytes": 400, "input_bytes": 800}}}
    backward = {"AllGather": {"tensor": {"count": 1, "bytes": 100, "input_bytes": 50}},
                "AllReduce": {"data": {"count": 1, "bytes": 60, "input_bytes": 120}}}
    return SimpleNamespace(memory=memory, comm=comm, comm_backward=backward, comm_time_estimate_s=0.002)


def fake_model(grad_norm=0.5):
    return SimpleNamespace(last_grad_norm=grad_norm, report=fake_report, local_ranks=(0, 1),
                           mesh=SimpleNamespace(size=2), runtime=SimpleNamespace(in_one_process=lambda: True))


def test_tokens_per_second_mfu_memory_and_comm_equal_their_sources():
    out = io.StringIO()
    telemetry = Telemetry(flops_per_token=6e6, peak_flops=2e12, devices=4, stream=out)
    record = telemetry.step(fake_model(), np.float32(2.5), tokens=4096, seconds=0.25)
    assert record.tokens_per_second == 4096 / 0.25
    assert record.model_flops == 6e6 * 4096
    assert record.mfu == pytest.approx(6e6 * 4096 / (0.25 * 4 * 2e12), rel=1e-12)
    assert (record.loss, record.grad_norm, record.step) == (2.5, 0.5, 0)
    assert record.memory_peak == {0: 1000, 1: 3000}
    assert record.comm_bytes == 400 + 100 + 60 and record.comm_seconds == 0.002
    line = out.getvalue()
    assert "step 0 | loss 2.5000 | grad_norm 0.5 | 16,384 tok/s | mfu 1.23% |" in line, line
    assert telemetry.step(fake_model(float("nan")), 1.0, 10, seconds=1.0).grad_norm is None  # none computed yet


def test_flops_from_the_estimator_and_peak_from_a_preset():
    config = TransformerConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=16)
    telemetry = Telemetry(config=config, hardware="a100-80gb", stream=io.StringIO())
    h, s, layers, vocab = 64, 16, 2, 128
    assert telemetry.flops_per_token == 6 * (layers * 12 * h * h + h * vocab) + 3 * layers * 4 * s * h  # 6N + attn
    assert telemetry.peak_flops == load_hardware("a100-80gb").peak_flops == 312e12
    record = telemetry.step(fake_model(), 1.0, tokens=64, seconds=0.5)
    assert record.devices == 2  # the model's mesh
    assert record.mfu == pytest.approx(telemetry.flops_per_token * 64 / (0.5 * 2 * 312e12), rel=1e-12)


def test_calibrated_cpu_peak_divides_by_one_process_in_simulation(monkeypatch):
    import mindspore_hyper.train.mfu as mfu_module

    calls = []
    monkeypatch.setattr(mfu_module, "calibrate_cpu",
                        lambda **kw: calls.append(kw) or SimpleNamespace(peak_flops=5e10))  # no measuring here
    telemetry = Telemetry(flops_per_token=1e6, hardware="cpu", stream=io.StringIO())
    assert calls == [{"processes": 1, "seconds": 0.2}] and telemetry.peak_flops == 5e10
    record = telemetry.step(fake_model(), 1.0, tokens=1000, seconds=0.1)
    assert record.devices == 1  # one process computes both simulated devices on this CPU
    assert record.mfu == pytest.approx(1e6 * 1000 / (0.1 * 1 * 5e10), rel=1e-12)


def test_seconds_are_the_wall_time_between_calls_and_the_bar_follows():
    clock, out = Clock(), io.StringIO()
    telemetry = Telemetry(flops_per_token=1.0, total_steps=4, progress=True, log_every=2, stream=out, clock=clock,
                          report=False)
    clock.now += 2.0
    first = telemetry.step(fake_model(), 1.0, tokens=100)
    clock.now += 0.5
    second = telemetry.step(fake_model(), 0.5, tokens=100)
    assert (first.seconds, second.seconds) == (2.0, 0.5)
    assert (first.tokens_per_second, second.tokens_per_second) == (50.0, 200.0)
    assert first.mfu is None and first.memory_peak == {}  # no peak given; report=False
    text = out.getvalue()
    assert "\r[" in text and "step 1 | loss 0.5000" in text and "step 0 |" not in text  # log_every=2
    telemetry.close()
    assert out.getvalue().endswith("\n")
    bar = ProgressBar(10, io.StringIO(), width=10, clock=clock)
    clock.now += 5.0
    assert bar.render(5, "loss 1") == "[#####.....] 5/10 1.00 it/s eta 00:05 | loss 1"


def test_a_parallel_models_report_feeds_the_record(pynative):
    import mindspore as ms
    from mindspore import Tensor, nn

    import mindspore_hyper as mh

    mh.set_context(mode="simulation", device_num=2)
    ms.set_seed(0)
    par = mh.auto_parallelize(nn.WithLossCell(nn.Dense(8, 4), nn.MSELoss()),
                              mh.Layout((2,), ("data",))(tensor_map=()))
    opt = nn.SGD(par.optimizer_parameters(), learning_rate=0.1)
    x, y = Tensor(np.ones((4, 8), np.float32)), Tensor(np.zeros((4, 4), np.float32))
    loss = par.train_step(opt, x, y)
    record = Telemetry(stream=io.StringIO()).step(par, loss, tokens=4, seconds=0.1, optimizer=opt)
    report = par.report(opt)
    assert record.memory_peak == {r: m["total"] for r, m in report.memory.items()} and len(record.memory_peak) == 2
    sent = sum(v["bytes"] for c in (report.comm, report.comm_backward) for a in c.values() for v in a.values())
    assert record.comm_bytes == sent > 0  # the gradients' data-parallel reduction
    assert record.loss == pytest.approx(float(loss))
    norm = getattr(par, "last_grad_norm", None)
    if norm is not None and not np.isnan(norm):  # train_step keeps the global gradient norm
        assert record.grad_norm == pytest.approx(float(norm))


def read_scalars(directory):
    """{step: {tag: value}} of a MindSpore summary event file (8-byte length, 4-byte CRC, Event, 4-byte CRC)."""
    from mindspore.train import summary_pb2

    raw = open(glob.glob(f"{directory}/*summary*")[0], "rb").read()
    out, i = {}, 0
    while i < len(raw):
        n, = struct.unpack("<Q", raw[i:i + 8])
        event = summary_pb2.Event()
        event.ParseFromString(raw[i + 12:i + 12 + n])
        i += 12 + n + 4
        for v in event.summary.value:
            out.setdefault(event.step, {})[v.tag] = v.scalar_value
    return out


def test_summary_record_scalars_read_back(tmp_path, pynative):
    with Telemetry(flops_per_token=1e6, peak_flops=1e12, devices=1, stream=io.StringIO(),
                   summary_dir=str(tmp_path / "summary")) as telemetry:
        for step, loss in enumerate((3.0, 2.0, 1.5)):
            telemetry.step(fake_model(), loss, tokens=512, seconds=0.5 + step)
    scalars = read_scalars(tmp_path / "summary")
    for record in telemetry.records:
        got = scalars[record.step]
        assert got["loss"] == record.loss and got["grad_norm"] == record.grad_norm
        assert got["tokens_per_second"] == pytest.approx(record.tokens_per_second, rel=1e-6)
        assert got["mfu"] == pytest.approx(record.mfu, rel=1e-6)
        assert (got["memory_peak_bytes"], got["comm_bytes"]) == (3000, 560)


def test_errors_name_the_option():
    with pytest.raises(ValueError, match=r"progress=True: needs total_steps="):
        Telemetry(progress=True)
    with pytest.raises(ValueError, match=r"flops_per_token=, config=: give one"):
        Telemetry(flops_per_token=1.0, config=TransformerConfig(layers=1, hidden=8, heads=2, vocab=8, seq_len=4))
    with pytest.raises(ValueError, match=r"hardware='tpu-v9': unknown preset"):
        Telemetry(hardware="tpu-v9")
    with pytest.raises(ValueError, match=r"peak_flops=-1: expected a number > 0"):
        Telemetry(peak_flops=-1)
    with pytest.raises(ValueError, match=r"seconds=0: expected > 0"):
        Telemetry(stream=io.StringIO()).step(fake_model(), 1.0, tokens=1, seconds=0)
