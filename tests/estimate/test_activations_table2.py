"""activation_bytes_per_layer against Korthikanti et al. 2022, Table 2, row by row, by hand."""
import pytest

from mindspore_hyper.estimate import TABLE2_ROWS, activation_bytes_per_layer, table2_row

# s=1024, b=2, h=512, a=8, t=4: sbh = 1,048,576; 5as/h = 80; 5as/(ht) = 20
S, B, H, A, T = 1024, 2, 512, 8, 4
SBH = 1024 * 2 * 512


def test_row1_no_parallelism():
    # sbh(34 + 5as/h) = 1,048,576 * (34 + 80)
    assert activation_bytes_per_layer(S, B, H, A) == 119_537_664
    assert table2_row(1, False, "none") == 1


def test_row2_tensor_parallel():
    # sbh(10 + 24/t + 5as/(ht)) = 1,048,576 * (10 + 6 + 20)
    assert activation_bytes_per_layer(S, B, H, A, tensor_parallel=T) == 37_748_736
    assert table2_row(T, False, "none") == 2


def test_row3_tensor_and_sequence_parallel():
    # sbh(34/t + 5as/(ht)) = 1,048,576 * (8.5 + 20)
    assert activation_bytes_per_layer(S, B, H, A, tensor_parallel=T, sequence_parallel=True) == 29_884_416
    assert table2_row(T, True, "none") == 3


def test_row4_tensor_parallel_selective_recompute():
    # sbh(10 + 24/t) = 1,048,576 * 16
    assert activation_bytes_per_layer(S, B, H, A, tensor_parallel=T, recompute="selective") == 16_777_216
    assert table2_row(T, False, "selective") == 4


def test_row5_tensor_sequence_parallel_selective_recompute():
    # sbh(34/t) = 1,048,576 * 8.5
    assert activation_bytes_per_layer(S, B, H, A, T, True, "selective") == 8_912_896
    assert table2_row(T, True, "selective") == 5


def test_row6_full_recompute_stores_the_layer_input_only():
    # 2sbh, whatever t and sequence parallelism (the table's row has no /t)
    for t, sp in ((1, False), (T, False), (T, True)):
        assert activation_bytes_per_layer(S, B, H, A, t, sp, "full") == 2 * SBH == 2_097_152
        assert table2_row(t, sp, "full") == 6


def test_rows_at_t1_reduce_to_row1():
    assert activation_bytes_per_layer(S, B, H, A, 1, True) == 119_537_664  # row 3 at t=1
    assert activation_bytes_per_layer(S, B, H, A, 1, False, "selective") == 34 * SBH  # row 4 at t=1


def test_fractions_are_exact():
    # s=1000, b=1, h=300, a=6, t=3: 300,000 * (10 + 8 + 5*6*1000/900) = 300,000 * 154/3
    assert activation_bytes_per_layer(1000, 1, 300, 6, tensor_parallel=3) == 15_400_000


def test_row_texts_name_every_formula():
    assert TABLE2_ROWS[1].endswith("sbh(34 + 5as/h)") and TABLE2_ROWS[6].endswith("sbh(2)")
    assert set(TABLE2_ROWS) == {1, 2, 3, 4, 5, 6}


@pytest.mark.parametrize("kwargs, match", [
    ({"seq_len": 0}, r"seq_len=0: expected an int >= 1"),
    ({"heads": 2.5}, r"heads=2.5: expected an int >= 1"),
    ({"tensor_parallel": True}, r"tensor_parallel=True: expected an int >= 1"),
    ({"recompute": "some"}, r"recompute='some': expected one of 'none', 'selective', 'full'"),
    ({"sequence_parallel": 1}, r"sequence_parallel=1: expected a bool"),
])
def test_bad_arguments_are_named(kwargs, match):
    args = {"seq_len": S, "micro_batch": B, "hidden": H, "heads": A, **kwargs}
    with pytest.raises(ValueError, match=match):
        activation_bytes_per_layer(**args)
