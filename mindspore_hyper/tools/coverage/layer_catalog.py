"""The layer zoo: `mindspore.nn` layer classes that run on CPU, each inside a small model.

A `LayerCase` builds a small model around one layer class (a layer without parameters gets a
Dense or 1x1 convolution before it, so a training step has weights to update) and says what
its input is. Shapes are tiny and every dimension the strategies of `layer_sweep` split (batch,
channels, features) is a multiple of 4. `layer_sweep` runs each case single-device and
simulated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from mindspore import nn

__all__ = ["LayerCase", "LAYERS", "NOT_ON_CPU"]


@dataclass(frozen=True)
class LayerCase:
    """One layer class inside a small model.

    Attributes:
        name: the layer as a user writes it (also the row of the table).
        build: makes the model (a Cell taking the input, returning the layer's output or a
            tuple whose first element is the output).
        shape: the input's shape (batch first).
        kind: "float" (standard normal) or "ids" (int32 in [0, 50)).
        train: the model's training flag in the sweep (False: eval mode, e.g. Dropout).
        note: shown in the table.
    """

    name: str
    build: Callable[[], nn.Cell]
    shape: Tuple[int, ...]
    kind: str = "float"
    train: bool = True
    note: Optional[str] = None


class _Chain(nn.Cell):
    """`first` then `layer` (the layer under test reads what a weighted layer made)."""

    def __init__(self, first: nn.Cell, layer: nn.Cell):
        super().__init__()
        self.first = first
        self.layer = layer

    def construct(self, x):
        return self.layer(self.first(x))


class _SelfAttention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def construct(self, x):
        return self.attn(x, x, x)[0]


class _Decoder(nn.Cell):
    """A decoder layer reading the input as target and its Dense projection as memory."""

    def __init__(self):
        super().__init__()
        self.memory = nn.Dense(8, 8)
        self.layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def construct(self, x):
        return self.layer(x, self.memory(x))


class _EmbedGRUHead(nn.Cell):
    """Embedding 50x8 -> GRU 8->8 (batch first) -> Dense: under ("tensor", None) for every weight
    the embedding's output is Partial(sum) over "tensor", so the GRU's biases are made Partial."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(52, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Dense(8, 4)

    def construct(self, ids):
        return self.head(self.gru(self.emb(ids))[0])


class _Cell(nn.Cell):
    """An RNN cell over one step, hidden state from a Dense of the input."""

    def __init__(self, cell: nn.Cell, lstm: bool = False):
        super().__init__()
        self.init = nn.Dense(8, 8)
        self.cell = cell
        self.lstm = lstm

    def construct(self, x):
        h = self.init(x)
        return self.cell(x, (h, h * 0.5)) if self.lstm else self.cell(x, h)


def _dense(layer: Callable[[], nn.Cell]) -> Callable[[], nn.Cell]:
    return lambda: _Chain(nn.Dense(8, 8), layer())


def _conv(layer: Callable[[], nn.Cell], dims: int) -> Callable[[], nn.Cell]:
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    return lambda: _Chain(conv(4, 8, 1, has_bias=True), layer())


X2 = (4, 8)          # batch, features
X3 = (4, 5, 8)       # batch, sequence, features
XR = (4, 3, 8)       # batch, sequence, features of the recurrent layers (a Python loop over steps)
C1 = (4, 4, 8)       # batch, channels, length
C2 = (4, 4, 6, 6)    # batch, channels, height, width
C3 = (4, 4, 4, 4, 4)  # batch, channels, depth, height, width

LAYERS: Tuple[LayerCase, ...] = (
    # recurrent
    LayerCase("nn.RNN", lambda: nn.RNN(8, 8, batch_first=True), XR),
    LayerCase("nn.RNN (2 layers, bidirectional)", lambda: nn.RNN(8, 8, 2, batch_first=True, bidirectional=True), XR),
    LayerCase("nn.GRU", lambda: nn.GRU(8, 8, batch_first=True), XR),
    LayerCase("nn.GRU (2 layers, bidirectional)", lambda: nn.GRU(8, 8, 2, batch_first=True, bidirectional=True), XR),
    LayerCase("nn.LSTM", lambda: nn.LSTM(8, 8, batch_first=True), XR),
    LayerCase("nn.LSTM (2 layers, bidirectional)", lambda: nn.LSTM(8, 8, 2, batch_first=True, bidirectional=True),
              XR),
    LayerCase("nn.Embedding -> nn.GRU -> nn.Dense", _EmbedGRUHead, XR[:2], kind="ids",
              note="the model of the GRU regression (batched path on a Partial input)"),
    LayerCase("nn.RNNCell", lambda: _Cell(nn.RNNCell(8, 8)), X2),
    LayerCase("nn.GRUCell", lambda: _Cell(nn.GRUCell(8, 8)), X2),
    LayerCase("nn.LSTMCell", lambda: _Cell(nn.LSTMCell(8, 8), lstm=True), X2),
    # convolution
    LayerCase("nn.Conv1d", lambda: nn.Conv1d(4, 8, 3, has_bias=True), C1),
    LayerCase("nn.Conv2d", lambda: nn.Conv2d(4, 8, 3, has_bias=True), C2),
    LayerCase("nn.Conv2d (groups 2, stride 2, pad)", lambda: nn.Conv2d(4, 8, 3, stride=2, pad_mode="pad", padding=1,
                                                                       group=2, has_bias=True), C2),
    LayerCase("nn.Conv3d", lambda: nn.Conv3d(4, 8, 3, has_bias=True), C3),
    LayerCase("nn.Conv1dTranspose", lambda: nn.Conv1dTranspose(4, 8, 3, has_bias=True), C1),
    LayerCase("nn.Conv2dTranspose", lambda: nn.Conv2dTranspose(4, 8, 3, has_bias=True), C2),
    LayerCase("nn.Conv3dTranspose", lambda: nn.Conv3dTranspose(4, 8, 3, has_bias=True), C3),
    # normalisation
    LayerCase("nn.BatchNorm1d", lambda: nn.BatchNorm1d(8), X2, note="training: batch statistics, moving averages"),
    LayerCase("nn.BatchNorm2d", _conv(lambda: nn.BatchNorm2d(8), 2), C2),
    LayerCase("nn.BatchNorm3d", _conv(lambda: nn.BatchNorm3d(8), 3), C3),
    LayerCase("nn.BatchNorm2d (eval)", _conv(lambda: nn.BatchNorm2d(8), 2), C2, train=False),
    LayerCase("nn.GroupNorm", _conv(lambda: nn.GroupNorm(2, 8), 2), C2),
    LayerCase("nn.LayerNorm", lambda: nn.LayerNorm((8,)), X3),
    # embedding, dense
    LayerCase("nn.Embedding", lambda: nn.Embedding(52, 8), (4, 5), kind="ids"),
    LayerCase("nn.Dense", lambda: nn.Dense(8, 8), X3),
    LayerCase("nn.Linear", lambda: nn.Linear(8, 8), X3),
    LayerCase("nn.BiDense", lambda: _Chain(nn.Identity(), _BiDense()), X2),
    # attention
    LayerCase("nn.MultiheadAttention", _SelfAttention, X3),
    LayerCase("nn.TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                               batch_first=True), X3),
    LayerCase("nn.TransformerDecoderLayer", _Decoder, X3),
    LayerCase("nn.TransformerEncoder (2 layers)", lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2), X3),
    # pooling
    LayerCase("nn.MaxPool1d", _conv(lambda: nn.MaxPool1d(2, 2), 1), C1),
    LayerCase("nn.MaxPool2d", _conv(lambda: nn.MaxPool2d(2, 2), 2), C2),
    LayerCase("nn.MaxPool3d", _conv(lambda: nn.MaxPool3d(2, 2), 3), C3),
    LayerCase("nn.AvgPool1d", _conv(lambda: nn.AvgPool1d(2, 2), 1), C1),
    LayerCase("nn.AvgPool2d", _conv(lambda: nn.AvgPool2d(2, 2), 2), C2),
    LayerCase("nn.AvgPool3d", _conv(lambda: nn.AvgPool3d(2, 2), 3), C3),
    LayerCase("nn.AdaptiveAvgPool1d", _conv(lambda: nn.AdaptiveAvgPool1d(4), 1), C1),
    LayerCase("nn.AdaptiveAvgPool2d", _conv(lambda: nn.AdaptiveAvgPool2d(3), 2), C2),
    LayerCase("nn.AdaptiveAvgPool3d", _conv(lambda: nn.AdaptiveAvgPool3d(2), 3), C3),
    LayerCase("nn.AdaptiveMaxPool1d", _conv(lambda: nn.AdaptiveMaxPool1d(4), 1), C1),
    LayerCase("nn.AdaptiveMaxPool2d", _conv(lambda: nn.AdaptiveMaxPool2d(3), 2), C2),
    LayerCase("nn.AdaptiveMaxPool3d", _conv(lambda: nn.AdaptiveMaxPool3d(2), 3), C3),
    LayerCase("nn.LPPool1d", _conv(lambda: nn.LPPool1d(2, 2, 2), 1), C1),
    LayerCase("nn.LPPool2d", _conv(lambda: nn.LPPool2d(2, 2, 2), 2), C2),
    # dropout (eval)
    LayerCase("nn.Dropout (eval)", _dense(lambda: nn.Dropout(p=0.5)), X3, train=False),
    LayerCase("nn.Dropout1d (eval)", _conv(lambda: nn.Dropout1d(0.5), 1), C1, train=False),
    LayerCase("nn.Dropout2d (eval)", _conv(lambda: nn.Dropout2d(0.5), 2), C2, train=False),
    LayerCase("nn.Dropout3d (eval)", _conv(lambda: nn.Dropout3d(0.5), 3), C3, train=False),
    # activations
    *(LayerCase(f"nn.{name}", _dense(make), X3) for name, make in (
        ("ReLU", nn.ReLU), ("ReLU6", nn.ReLU6), ("LeakyReLU", lambda: nn.LeakyReLU(0.1)), ("GELU", nn.GELU),
        ("FastGelu", nn.FastGelu), ("SiLU", nn.SiLU), ("Sigmoid", nn.Sigmoid), ("Tanh", nn.Tanh),
        ("Softmax", nn.Softmax), ("LogSoftmax", nn.LogSoftmax), ("Softmin", nn.Softmin), ("ELU", nn.ELU),
        ("CELU", nn.CELU), ("SeLU", nn.SeLU), ("HSwish", nn.HSwish),
        ("HSigmoid", nn.HSigmoid), ("Mish", nn.Mish), ("Softsign", nn.Softsign),
        ("Hardtanh", nn.Hardtanh), ("LogSigmoid", nn.LogSigmoid), ("Tanhshrink", nn.Tanhshrink),
        ("HShrink", nn.HShrink), ("SoftShrink", nn.SoftShrink), ("Threshold", lambda: nn.Threshold(0.1, 0.0)),
        ("GLU", nn.GLU),
    )),
    # shape
    LayerCase("nn.PReLU", _dense(lambda: nn.PReLU(8)), X2),
    LayerCase("nn.PReLUExt", _dense(lambda: nn.PReLUExt(8)), X2),
    LayerCase("nn.Flatten", _conv(nn.Flatten, 2), C2),
    LayerCase("nn.Unflatten", _dense(lambda: nn.Unflatten(2, (2, 4))), X3),
    LayerCase("nn.Upsample (nearest)", _conv(lambda: nn.Upsample(size=(12, 12), mode="nearest"), 2), C2),
    LayerCase("nn.Upsample (bilinear)", _conv(lambda: nn.Upsample(size=(12, 12), mode="bilinear"), 2), C2),
    LayerCase("nn.PixelShuffle", _conv(lambda: nn.PixelShuffle(2), 2), C2),
    LayerCase("nn.PixelUnshuffle", _conv(lambda: nn.PixelUnshuffle(2), 2), C2),
    LayerCase("nn.ZeroPad2d", _conv(lambda: nn.ZeroPad2d(1), 2), C2),
    LayerCase("nn.ConstantPad1d", _conv(lambda: nn.ConstantPad1d(1, 0.5), 1), C1),
    LayerCase("nn.ReflectionPad1d", _conv(lambda: nn.ReflectionPad1d(1), 1), C1),
    LayerCase("nn.ReflectionPad2d", _conv(lambda: nn.ReflectionPad2d(1), 2), C2),
    LayerCase("nn.ReplicationPad1d", _conv(lambda: nn.ReplicationPad1d(1), 1), C1),
    LayerCase("nn.ReplicationPad2d", _conv(lambda: nn.ReplicationPad2d(1), 2), C2),
    LayerCase("nn.Identity", _dense(nn.Identity), X3),
    LayerCase("nn.Softmax2d", _conv(nn.Softmax2d, 2), C2),
    LayerCase("nn.ChannelShuffle", _conv(lambda: nn.ChannelShuffle(2), 2), C2),
    LayerCase("nn.ConstantPad2d", _conv(lambda: nn.ConstantPad2d(1, 0.5), 2), C2),
    LayerCase("nn.Tril", _dense(nn.Tril), X3),
    LayerCase("nn.Triu", _dense(nn.Triu), X3),
)


# Layer classes of mindspore.nn that MindSpore 2.10 does not run on CPU even on one device
# (class -> MindSpore's error): listed in the table, not swept.
NOT_ON_CPU = {
    "nn.InstanceNorm1d/2d/3d": "Unsupported op [InstanceNorm] on CPU",
    "nn.LayerNormExt": "Create kernelmod for op LayerNormExt failed",
    "nn.EmbeddingExt": "The kernel Embedding unregistered",
    "nn.MaxPool2dExt": "Not found op FuncMaxPool2D on device CPU",
    "nn.AvgPool2dExt": "The kernel AvgPool2D unregistered",
    "nn.Unfold": "Unsupported op [ExtractImagePatches] on CPU",
    "nn.Upsample (scale_factor, 4-D)": "'scale_factor' option cannot currently be set with the mode = nearest/bilinear "
                                       "and dim = 4D (size= works, swept)",
}


class _BiDense(nn.Cell):
    """nn.BiDense reading the input twice."""

    def __init__(self):
        super().__init__()
        self.layer = nn.BiDense(8, 8, 8)

    def construct(self, x):
        return self.layer(x, x * 0.5)
