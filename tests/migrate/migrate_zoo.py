"""A model touching every mapped torch op in its torch-function, Tensor-method and operator forms
(torch.fx sees those) and, exported, in its aten forms; converted, each must match torch."""
import math

import torch
import torch.nn.functional as F

import mindspore_hyper.migrate.mappings  # noqa: F401  (registers torch.ops.mindspore_hyper.selective_scan)


class OpZoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 5))
        self.w2 = torch.nn.Parameter(torch.randn(5, 6))
        self.b = torch.nn.Parameter(torch.randn(5))
        self.conv_w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))
        self.norm_w = torch.nn.Parameter(torch.rand(6) + 0.5)
        self.table = torch.nn.Parameter(torch.randn(10, 6))
        self.gn_w = torch.nn.Parameter(torch.rand(3) + 0.5)
        self.conv1d_w = torch.nn.Parameter(torch.randn(3, 4, 3))
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(4, 4, 3, stride=2, padding="valid"), torch.nn.AvgPool2d(2, 1, 1, count_include_pad=False),
            torch.nn.AdaptiveAvgPool2d(2), torch.nn.GroupNorm(2, 4), torch.nn.SiLU(), torch.nn.Flatten(),
            torch.nn.Linear(16, 6), torch.nn.LayerNorm(6), torch.nn.Tanh(), torch.nn.Dropout(0.3),
            torch.nn.LeakyReLU(0.2), torch.nn.Sigmoid(), torch.nn.Softmax(-1), torch.nn.LogSoftmax(-1),
            torch.nn.GELU("tanh"), torch.nn.Identity())
        self.seq1d = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3, padding=1), torch.nn.BatchNorm1d(4))
        self.emb = torch.nn.Embedding(10, 6, padding_idx=0)

    def forward(self, x, y, img, ids, mask):
        b, h, n = x.shape
        out = []
        # modules
        out += [self.layers(img), self.seq1d(x), self.emb(ids)]
        # linear algebra
        out += [F.linear(x, self.w.t(), self.b), torch.matmul(x, self.w), x.matmul(self.w), x @ self.w,
                torch.mm(x[0], self.w), x[0].mm(self.w), torch.bmm(x, y.transpose(1, 2)), x.bmm(y.transpose(1, 2)),
                torch.addmm(self.b, x[0], self.w, beta=0.5, alpha=2.0), x[0].new_zeros(5).addmm(x[0], self.w),
                torch.baddbmm(x[:, :, :4], x, y.transpose(1, 2)[:, :, :4]),
                x[:, :, :4].baddbmm(x, y.transpose(1, 2)[:, :, :4], beta=0.0)]
        # convolution, norm, embedding, attention, dropout (functional)
        out += [F.conv2d(img, self.conv_w, stride=1, padding=1), torch.conv2d(img, self.conv_w, padding="same"),
                F.layer_norm(x, (n,), self.norm_w, None, 1e-5), F.group_norm(img, 3, self.gn_w),
                F.embedding(ids, self.table), F.embedding(ids, self.table, padding_idx=2), x[0].T,
                F.dropout(x, 0.5, training=False),
                F.scaled_dot_product_attention(x, y, y, is_causal=True),
                F.scaled_dot_product_attention(x, y, y, attn_mask=mask[:, :, :4])]
        # activations
        out += [F.relu(x), torch.relu(x), x.relu(), F.gelu(x), F.silu(x), torch.sigmoid(x),
                F.sigmoid(x), x.sigmoid(), torch.tanh(x), F.tanh(x), x.tanh(), F.softmax(x, -1), torch.softmax(x, 1),
                x.softmax(-1), F.softmax(x, dim=-1, dtype=torch.float32), F.log_softmax(x, -1),
                torch.log_softmax(x, -1), x.log_softmax(-1), F.leaky_relu(x, 0.1),
                F.softplus(x), F.softplus(x * 10, beta=2.0, threshold=5.0), torch.square(x), x.square(),
                F.max_pool2d(img, 2), F.avg_pool2d(img, 2, 1, 1), F.adaptive_avg_pool2d(img, 1)]
        # shapes
        z = x.view(b, -1).reshape(b, h, n).view(-1, n).view_as(x).reshape_as(y)
        out += [z, torch.reshape(x, (b * h, n)), x.permute(2, 0, 1), torch.permute(x, (1, 0, 2)),
                torch.transpose(x, 0, 2), x.transpose(1, 2), torch.swapaxes(x, 0, 1), x.swapaxes(0, 2),
                x[0].t(), torch.t(x[0]), x.unsqueeze(1), torch.unsqueeze(x, -1), x.unsqueeze(0).squeeze(0),
                torch.squeeze(x[:, :1], 1), x[:, :1].squeeze(), torch.flatten(x, 1), x.flatten(),
                x[:, :1].expand(b, h, n), x[:, :1].expand_as(y), x.contiguous(), x.clone(), torch.clone(x),
                x.detach()]
        # dtypes
        out += [x.float(), x.half().float(), x.double().float(), x.int(), x.long(), x.bool(),
                x.bfloat16().float(), x.to(torch.int32), x.to(ids), x.type(torch.int64), x.type_as(ids),
                x.to("cpu"), ids.to(x.device, torch.float32)]
        # splitting, joining, indexing
        p1, p2 = x.split(3, dim=2)
        q1, q2 = torch.split(x, [2, 4], 2)
        c1, c2 = x.chunk(2, -1)
        d1, d2 = torch.chunk(x, 2, 1)
        u = x.unbind(0)
        v = torch.unbind(x, 1)
        out += [p1, p2, q1, q2, c1, c2, d1, d2, u[1], v[2], torch.cat([x, y], 1), torch.concat((x, y), -1),
                torch.stack([x, y], 1), x[:, 1:3], x[..., None, ::2], x[0, :, -1], x[:, ids[0, :2]],
                torch.select(x, 1, 2), x.select(2, -1), torch.gather(x, 2, ids[:, None, :].expand(b, h, n) % n),
                x.gather(1, (ids[:, :3, None] % h).expand(b, 3, n)), torch.index_select(x, 2, ids[0] % n),
                x.index_select(0, ids[:, 0] % b), torch.masked_fill(x, mask, -1.0), x.masked_fill(mask, 2.0),
                torch.where(mask, x, y), torch.where(mask, x, 0.5), x.where(mask, y), x.repeat(1, 2, 1),
                x.repeat((2, 1, 1))]
        # sizes as Python values
        out += [x * x.size(1), x + x.size()[2] // 3, y - x.dim(), x / math.sqrt(x.numel() % 7 + 1),
                x * x.shape[-1] ** 2 - (-n), torch.full((b, n), n % 4)]
        # elementwise
        out += [torch.add(x, y, alpha=2), x.add(y), x + 1, 1 - x, torch.sub(x, y), torch.subtract(x, y, alpha=0.5),
                x.sub(1), torch.rsub(x, 1.5), x * y, torch.mul(x, 3), torch.multiply(x, y), x.mul(y),
                x ** 2, 2 ** x, torch.pow(x, 3), x.pow(y.abs()), x % 0.7, torch.remainder(x, 0.6), x.remainder(y + 3),
                torch.minimum(x, y), torch.maximum(x, y), x / y, torch.div(x, 2), torch.true_divide(x, y), x.div(y),
                torch.div(x, y, rounding_mode="floor"), x // 0.3, torch.floor_divide(ids, 3), ids.floor_divide(4),
                -x, torch.neg(x), x.neg(), torch.abs(x), x.abs(), torch.exp(x), x.exp(), torch.log(x.abs() + 1),
                (x.abs() + 1).log(), torch.sqrt(x.abs()), x.abs().sqrt(), torch.rsqrt(x.abs() + 1),
                (x.abs() + 1).rsqrt(), torch.erf(x), x.erf(), torch.sin(x), x.sin(), torch.cos(x), x.cos(),
                torch.reciprocal(x.abs() + 1), (x + 9).reciprocal(), torch.clamp(x, -0.5, 0.5), x.clamp(min=0.1),
                torch.clip(x, max=0.2), x.clip(-0.1, 0.1), x.clamp_min(0.3)]
        # comparisons and logic
        out += [x == y, torch.eq(x, 0.5), x.eq(y), x != y, torch.ne(x, y), x.ne(0.0), x < y, torch.lt(x, y),
                x.lt(0.2), x <= y, torch.le(x, y), x.le(0.0), x > y, torch.gt(x, y), x.gt(0.1), x >= y,
                torch.ge(x, y), x.ge(0.3), torch.logical_and(mask, x > 0), mask.logical_and(x < 0),
                torch.logical_or(mask, x > 0), mask.logical_or(x < 0), torch.logical_not(mask), mask.logical_not(),
                mask & (x > 0), torch.bitwise_and(mask, x > 1), mask.bitwise_and(x < 1), ids & 6,
                mask | (x > 0), torch.bitwise_or(mask, x > 1), mask.bitwise_or(x < 1), ~mask,
                torch.bitwise_not(mask), mask.bitwise_not()]
        # reductions
        out += [torch.sum(x), x.sum(1), x.sum((0, 2), keepdim=True), torch.mean(x, -1), x.mean(), torch.prod(x, 1),
                x.prod(-1, keepdim=True), torch.amax(x, 1), x.amax((0, 1)), torch.amin(x, -1), x.amin(),
                torch.max(x), torch.max(x, 1).values, x.max(-1, keepdim=True)[1], torch.max(x, y), x.max(y),
                torch.min(x), torch.min(x, 2)[0], x.min(0).indices, torch.min(x, y), torch.argmax(x, -1),
                x.argmax(1, keepdim=True), torch.cumsum(x, 1), x.cumsum(-1), ids.cumsum(1), torch.var(x, 1),
                x.var(-1, unbiased=False), torch.std(x, 2, keepdim=True), x.std(correction=0), torch.any(mask),
                mask.any(1), torch.all(mask, -1), mask.all()]
        # creation
        out += [torch.arange(n) + x, torch.arange(1, n, 2) + x[..., :3], torch.arange(0.0, 3.0, 0.5) + x.sum(),
                torch.zeros((b, h)) + x[..., 0], torch.zeros((b, n), dtype=torch.int64) + ids,
                torch.ones((b, h, n)) * x, torch.full((b, h), 2.0) + x[..., 1], torch.zeros_like(x) + y,
                torch.ones_like(ids) + ids, torch.full_like(x, 7) * y, x.new_ones(b, h) + x[..., 2],
                x.new_zeros((b, n)) + x[:, 0], x.new_full((h, n), 3.0) * x, torch.tril(x), x.tril(-1),
                torch.triu(x, 1), x.triu()]
        # differences and top-k
        index = torch.topk(x, 2).indices
        out += [torch.scatter(x, 2, index, 1.0), x.scatter(-1, index, y[..., :2]), torch.zeros_like(x).scatter(2, index, 2.5),
                torch.repeat_interleave(x, 2, dim=1), x.repeat_interleave(3, -1), x.repeat_interleave(2),
                torch.diff(x, dim=-1), x.diff(prepend=x[..., :1]), torch.topk(x, 2).values, x.topk(3, 1, False)[1]]
        # ops the transformers sweep needed (activations, norms, sorting, padding, sliding blocks)
        fresh = x.new_empty(b, h, n)
        fresh.copy_(x * 2)  # a whole fresh tensor overwritten: aten.copy
        out += [torch.expm1(x), x.expm1(), torch.log1p(x.abs()), x.abs().log1p(), torch.floor(x), x.floor(),
                torch.ceil(x), x.ceil(), torch.sign(x), x.sign(), torch.tan(x * 0.5), (x * 0.5).tan(),
                F.hardtanh(x, -0.3, 0.4), torch.sort(x, -1)[0], torch.sort(x, 1, descending=True)[1],
                x.sort(0)[0], torch.logsumexp(x, -1), x.logsumexp((0, 1), keepdim=True),
                torch.linalg.vector_norm(x, dim=-1), torch.linalg.vector_norm(x, 1.0, 1, keepdim=True),
                torch.linalg.vector_norm(x), F.rms_norm(x, (n,), self.norm_w, 1e-5), F.rms_norm(x, (h, n)),
                F.pad(x, (1, 2)), F.pad(x, (0, 0, 2, 1), value=-1.5), F.unfold(img, (2, 2), padding=1), fresh,
                F.adaptive_avg_pool1d(x, 1), F.conv1d(x, self.conv1d_w, padding=1), F.logsigmoid(x * 30),
                torch.tensor_split(x, [1, 4], 2)[0], torch.tensor_split(x, [1, 4], 2)[2],  # Mamba's split
                x.tensor_split(3, dim=1)[0], x.tensor_split(3, dim=1)[2], x.clamp_max(0.2)]  # 3 sections of 4; Ergo
        # SEW's squeeze pooling, PP-LCNet's hard activations (x * 4 reaches past both kinks), Gated DeltaNet's eye
        out += [F.avg_pool1d(x, 2), F.avg_pool1d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                F.hardsigmoid(x * 4), F.hardswish(x * 4), torch.eye(x.shape[1], x.shape[2]) + x,  # eye: fx records it of sizes
                x.unflatten(-1, (2, 3)), torch.unflatten(x, 1, (2, -1))]  # Qwen4-Exp's mixing weights
        # Wav2Vec2-Conformer's gated convolution, xLSTM's concatenate (torch.cat's NumPy-style name), YOSO's acos
        # (acos of |q| <= 0.9: it is ill-conditioned near +-1, slope -1 / sqrt(1 - q^2))
        out += [F.glu(x, -1), F.glu(x, 1), torch.concatenate([x, y], 2), torch.acos(x.sin() * 0.9),
                (x.sin() * 0.9).acos()]
        # weight norm (Hubert's parametrized convolution): over all but the last, all but the first, every dimension
        out += [torch._weight_norm(self.conv1d_w, self.norm_w[:3].reshape(1, 1, 3), 2),
                torch._weight_norm(self.conv1d_w, self.gn_w.reshape(3, 1, 1), 0),
                torch._weight_norm(self.conv1d_w, self.b[0], -1)]
        # einsum (ellipsis, implicit output) and Mamba's selective scan: channels 4, length 6, state 3
        out += [torch.einsum("bhn,bgn->bhg", x, y), torch.einsum("...n,mn", x, self.w2), x.masked_fill(mask, 0),
                torch.ops.mindspore_hyper.selective_scan(x, y, -torch.exp(self.w2[:4, :3]), x[:, :3], y[:, 1:],
                                                         self.b[:4], y, self.b[:4], True),
                F.interpolate(img, size=(5, 11), mode="bilinear"),  # MobileViT's resizing
                F.interpolate(img, size=(12, 3), mode="bilinear", align_corners=True),
                torch.real(torch.fft.fftn(x, dim=(1, 2))), torch.real(torch.fft.fftn(y, norm="ortho"))]  # FNet
        # JetMoE's ungrouping of the expert rows (index_add) and its truncating division of sorted positions
        out += [torch.index_add(x, 2, ids[0] % n, y), x.index_add(1, ids[0, :2] % h, y[:, :2], alpha=2),
                torch.div(ids - 5, 3, rounding_mode="trunc"), torch.div(x, 0.3, rounding_mode="trunc")]
        # TAPAS's segment reductions (positions 0-2 of the last dimension, several elements each) and PhiMoE's
        # uninitialised tensor, written before it is read
        segments = (ids % 3)[:, None, :].expand(b, h, n)
        unset = torch.empty_like(x)
        unset.copy_(y * 3)
        out += [torch.scatter_reduce(x, 2, segments, y, "amax"),
                x.scatter_reduce(2, segments, y, "sum", include_self=False), unset]
        return tuple(out)


class DynamicZoo(torch.nn.Module):
    """Ops only a shape-general (structure="modules") export keeps: sizes read at run time, creation from them."""

    def forward(self, x):
        b, t, n = x.shape
        positions = torch.arange(t) + torch.zeros(b, t) + torch.ones(b, t) + torch.full((b, t), 0.5)
        flat = x.transpose(1, 2).contiguous().view(b, -1)
        written = x.new_empty(b, t, n + 2)  # DeepSeek-V3's key expansion: slices of a fresh tensor written
        written[..., :n].copy_(x)
        written[..., n:].copy_(x[..., :2] * 2)
        written[:, 0].mul_(3)
        written[:, -1].copy_(x[:, 0, :1].expand(b, n + 2))
        scale = torch.tensor([1.0, 2.0, 3.0]) * torch.scalar_tensor(2.5)  # constants made in forward
        with torch.no_grad():  # a no-grad region (exported as a nested graph, inlined): no gradient out of it
            frozen = x * 2
        first = x[:, :min(t, 3)] + x[:, :max(t - 4, 1)].sum(1, keepdim=True)  # torch.sym_min / sym_max
        masked = x * 1
        masked[x > 0.5] = 0.25  # x[mask] = v on a tensor the program made: aten.index_put_
        eye = x * torch.eye(t, n)  # aten.eye of a run-time size (Gated DeltaNet's `torch.eye(chunk_size)`)
        eye = eye + x.unflatten(1, (t, 1)).sum(2)  # aten.unflatten in the port (Qwen4-Exp)
        strided = x * 1
        strided[..., 1:n:2] = x[..., 1::2] * 3  # aten.slice_scatter with a step (Qwen3.5's rotary sections)
        filled = torch.triu(torch.zeros(t, t).fill_(-2.5), diagonal=1)  # aten.fill_ (FSMT's causal mask)
        rows = x * 1
        rows[x[..., 0] > 0] = scale  # a mask of the leading dimensions, one value row (T5Gemma 2's embeddings)
        return (flat * (0.5 * t), positions, written, x * scale, frozen + x, first, masked, eye,  # 0.5 * t: sym_float
                strided, filled + x[:, :, :1], rows)


def zoo_inputs():
    torch.manual_seed(0)
    mask = torch.rand(2, 4, 6) > 0.5
    mask[..., 0] = True  # every attention row keeps a key
    return (torch.randn(2, 4, 6), torch.randn(2, 4, 6), torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2, 6)), mask)
