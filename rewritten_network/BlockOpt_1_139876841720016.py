import sys
import mindspore
from mindspore import nn
from mindspore.nn import Cell
from mindspore.ops import functional as F
#
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/ops/function')
import mindspore.common.dtype as mstype
from mindspore.common.tensor import Tensor
from nn_func import dtype_
from nn_func import gelu_
from nn_func import sqrt_
from nn_func import div_
from nn_func import erf_

def gelu_opt_1(input, approximate='none'):
    list_var_1 = ['none', 'tanh']
    compare_var_2 = approximate not in list_var_1
    if compare_var_2:
        raise ValueError("For ops.gelu, approximate value should be either 'none' or 'tanh'.")
    x_dtype = dtype_(input)
    list_var = [mstype.float16, mstype.float32, mstype.float64, mstype.bfloat16]
    compare_var_1 = x_dtype not in list_var
    if compare_var_1:
        raise TypeError(f'For gelu, the input dtype must be bfloat16, float16, float32 or float64, but got {x_dtype}.')
    compare_var = approximate == 'tanh'
    if compare_var:
        output = gelu_(input)
    else:
        Tensor_var_2 = Tensor(2.0, x_dtype)
        output = sqrt_(Tensor_var_2)
        output = div_(input, output)
        Tensor_var_1 = Tensor(1.0, x_dtype)
        erf__var = erf_(output)
        output = erf__var + Tensor_var_1
        Tensor_var = Tensor(0.5, x_dtype)
        mult_var = input * output
        output = mult_var * Tensor_var
    return output
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/loss')
from mindspore.nn.cell import Cell
from loss import LossBase

class LossBaseOpt(LossBase, Cell):

    def __init__(self):
        Cell.__init__(self)
        for key, value in LossBase.__dict__.items():
            if not key.startswith('__'):
                setattr(LossBaseOpt, key, value)
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/loss')
from mindspore import ops
from loss import SoftmaxCrossEntropyWithLogits
from loss import _check_is_tensor

class SoftmaxCrossEntropyWithLogitsOpt_1(SoftmaxCrossEntropyWithLogits, LossBaseOpt):

    def __init__(self, obj):
        LossBaseOpt.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, logits, labels):
        _check_is_tensor('logits', logits, self.cls_name)
        _check_is_tensor('labels', labels, self.cls_name)
        if self.sparse:
            compare_var = self.reduction == 'mean'
            if compare_var:
                x = self.sparse_softmax_cross_entropy(logits, labels)
                return x
            subscript_var = ops.shape(logits)[-1]
            labels = self.one_hot(labels, subscript_var, self.on_value, self.off_value)
        x = self.softmax_cross_entropy(logits, labels)[0]
        get_loss_var = self.get_loss(x)
        return get_loss_var
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')
from basic import Dense
from mindspore.train.amp import amp_cast

class DenseOpt_5(Dense, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, x):
        x_var = amp_cast(x, mindspore.float16)
        x_shape = self.shape_op(x_var)
        x_shape = amp_cast(x_shape, mindspore.float32)
        len_var_1 = len(x_shape)
        compare_var_1 = len_var_1 != 2
        if compare_var_1:
            subscript_var = x_shape[-1]
            usub_var = -1
            tuple_var = (usub_var, subscript_var)
            x_var_4 = amp_cast(x, mindspore.float16)
            tuple_var = amp_cast(tuple_var, mindspore.float16)
            x = self.reshape(x_var_4, tuple_var)
            x = amp_cast(x, mindspore.float32)
        x_var_1 = amp_cast(x, mindspore.float16)
        weight_var = amp_cast(self.weight, mindspore.float16)
        x = self.matmul(x_var_1, weight_var)
        x = amp_cast(x, mindspore.float32)
        if self.has_bias:
            x_var_3 = amp_cast(x, mindspore.float16)
            bias_var = amp_cast(self.bias, mindspore.float16)
            x = self.bias_add(x_var_3, bias_var)
            x = amp_cast(x, mindspore.float32)
        if self.activation_flag:
            x = self.activation(x)
        len_var = len(x_shape)
        compare_var = len_var != 2
        if compare_var:
            subscript_var_2 = ops.shape(x)[-1]
            tuple_var_1 = (subscript_var_2,)
            subscript_var_1 = x_shape[:-1]
            out_shape = subscript_var_1 + tuple_var_1
            x_var_2 = amp_cast(x, mindspore.float16)
            out_shape = amp_cast(out_shape, mindspore.float16)
            x = self.reshape(x_var_2, out_shape)
            x = amp_cast(x, mindspore.float32)
        return x

    def extend_repr(self):
        s = f'input_channels={self.in_channels}, output_channels={self.out_channels}'
        if self.has_bias:
            s += f', has_bias={self.has_bias}'
        if self.activation_flag:
            s += f', activation={self.activation}'
        return s
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')

class DenseOpt_4(Dense, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, x):
        x_var = amp_cast(x, mindspore.float16)
        x_shape = self.shape_op(x_var)
        x_shape = amp_cast(x_shape, mindspore.float32)
        len_var_1 = len(x_shape)
        compare_var_1 = len_var_1 != 2
        if compare_var_1:
            subscript_var = x_shape[-1]
            usub_var = -1
            tuple_var = (usub_var, subscript_var)
            x_var_4 = amp_cast(x, mindspore.float16)
            tuple_var = amp_cast(tuple_var, mindspore.float16)
            x = self.reshape(x_var_4, tuple_var)
            x = amp_cast(x, mindspore.float32)
        x_var_1 = amp_cast(x, mindspore.float16)
        weight_var = amp_cast(self.weight, mindspore.float16)
        x = self.matmul(x_var_1, weight_var)
        x = amp_cast(x, mindspore.float32)
        if self.has_bias:
            x_var_3 = amp_cast(x, mindspore.float16)
            bias_var = amp_cast(self.bias, mindspore.float16)
            x = self.bias_add(x_var_3, bias_var)
            x = amp_cast(x, mindspore.float32)
        if self.activation_flag:
            x = self.activation(x)
        len_var = len(x_shape)
        compare_var = len_var != 2
        if compare_var:
            subscript_var_2 = ops.shape(x)[-1]
            tuple_var_1 = (subscript_var_2,)
            subscript_var_1 = x_shape[:-1]
            out_shape = subscript_var_1 + tuple_var_1
            x_var_2 = amp_cast(x, mindspore.float16)
            out_shape = amp_cast(out_shape, mindspore.float16)
            x = self.reshape(x_var_2, out_shape)
            x = amp_cast(x, mindspore.float32)
        return x

    def extend_repr(self):
        s = f'input_channels={self.in_channels}, output_channels={self.out_channels}'
        if self.has_bias:
            s += f', has_bias={self.has_bias}'
        if self.activation_flag:
            s += f', activation={self.activation}'
        return s
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')
from activation import GELU

class GELUOpt_1(GELU, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, x):
        gelu_var = gelu_opt_1(x, approximate=self.approximate)
        return gelu_var
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')

class DenseOpt_3(Dense, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, x):
        x_var = amp_cast(x, mindspore.float16)
        x_shape = self.shape_op(x_var)
        x_shape = amp_cast(x_shape, mindspore.float32)
        len_var_1 = len(x_shape)
        compare_var_1 = len_var_1 != 2
        if compare_var_1:
            subscript_var = x_shape[-1]
            usub_var = -1
            tuple_var = (usub_var, subscript_var)
            x_var_4 = amp_cast(x, mindspore.float16)
            tuple_var = amp_cast(tuple_var, mindspore.float16)
            x = self.reshape(x_var_4, tuple_var)
            x = amp_cast(x, mindspore.float32)
        x_var_1 = amp_cast(x, mindspore.float16)
        weight_var = amp_cast(self.weight, mindspore.float16)
        x = self.matmul(x_var_1, weight_var)
        x = amp_cast(x, mindspore.float32)
        if self.has_bias:
            x_var_3 = amp_cast(x, mindspore.float16)
            bias_var = amp_cast(self.bias, mindspore.float16)
            x = self.bias_add(x_var_3, bias_var)
            x = amp_cast(x, mindspore.float32)
        if self.activation_flag:
            x = self.activation(x)
        len_var = len(x_shape)
        compare_var = len_var != 2
        if compare_var:
            subscript_var_2 = ops.shape(x)[-1]
            tuple_var_1 = (subscript_var_2,)
            subscript_var_1 = x_shape[:-1]
            out_shape = subscript_var_1 + tuple_var_1
            x_var_2 = amp_cast(x, mindspore.float16)
            out_shape = amp_cast(out_shape, mindspore.float16)
            x = self.reshape(x_var_2, out_shape)
            x = amp_cast(x, mindspore.float32)
        return x

    def extend_repr(self):
        s = f'input_channels={self.in_channels}, output_channels={self.out_channels}'
        if self.has_bias:
            s += f', has_bias={self.has_bias}'
        if self.activation_flag:
            s += f', activation={self.activation}'
        return s
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')
from normalization import LayerNorm

class LayerNormOpt_1(LayerNorm, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, input_x):
        astype_var_1 = self.beta.astype(input_x.dtype)
        astype_var = self.gamma.astype(input_x.dtype)
        y, _, _ = self.layer_norm(input_x, astype_var, astype_var_1)
        return y

    def extend_repr(self):
        return 'normalized_shape={}, begin_norm_axis={}, begin_params_axis={}, gamma{}, beta={}'.format(self.normalized_shape, self.begin_norm_axis, self.begin_params_axis, self.gamma, self.beta)
#
sys.path.insert(0, '/work/main/.venv/lib/python3.11/site-packages/mindspore/nn/layer')
from embedding import Embedding

class EmbeddingOpt_1(Embedding, Cell):

    def __init__(self, obj):
        Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)

    def construct(self, ids):
        tuple_var = (self.embedding_size,)
        get_shp_var = self.get_shp(ids)
        out_shape = get_shp_var + tuple_var
        flat_ids = self.reshape_flat(ids, self.shp_flat)
        if self.use_one_hot:
            one_hot_ids = self.one_hot(flat_ids, self.vocab_size, self.on_value, self.off_value)
            one_hot_ids = amp_cast(one_hot_ids, mindspore.float16)
            embedding_table_var = amp_cast(self.embedding_table, mindspore.float16)
            output_for_reshape = self.array_mul(one_hot_ids, embedding_table_var)
            output_for_reshape = amp_cast(output_for_reshape, mindspore.float32)
        else:
            output_for_reshape = self.gather(self.embedding_table, flat_ids, 0)
        output = self.reshape(output_for_reshape, out_shape)
        return output

    def extend_repr(self):
        return f'vocab_size={self.vocab_size}, embedding_size={self.embedding_size}, use_one_hot={self.use_one_hot}, embedding_table={self.embedding_table}, dtype={self.dtype}, padding_idx={self.padding_idx}'
#
sys.path.insert(0, '/tmp/mp')
Block = getattr(sys.modules['__main__'], 'Block')

class BlockOpt_1(Block, nn.Cell):

    def __init__(self, obj):
        nn.Cell.__init__(self)
        for key, value in obj.__dict__.items():
            setattr(self, key, value)
        self.embed = EmbeddingOpt_1(self.embed)
        self.norm = LayerNormOpt_1(self.norm)
        self.up = DenseOpt_3(self.up)
        self.act = GELUOpt_1(self.act)
        self.down = DenseOpt_4(self.down)
        self.head = DenseOpt_5(self.head)
        self.loss = SoftmaxCrossEntropyWithLogitsOpt_1(self.loss)

    def construct(self, ids, labels):
        h = self.embed(ids)
        norm_var = self.norm(h)
        up_var = self.up(norm_var)
        act_var = self.act(up_var)
        down_var = self.down(act_var)
        h = h + down_var
        usub_var_1 = -1
        head_var = self.head(h)
        logits = head_var.reshape(usub_var_1, 64)
        usub_var = -1
        reshape_var = labels.reshape(usub_var)
        loss_var = self.loss(logits, reshape_var)
        return loss_var
#