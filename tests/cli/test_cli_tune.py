"""`mindspore-hyper tune` through the console script: the offload tuners on the GPT preset, JSON, errors."""
from cli_run import cli, cli_json

# GPT preset: each block's parameters are 195 KB (4 blocks of 64 KB; 16 with optimizer states and
# gradients), so a 1 MB device tier holds one block's working set at a time.
STORE = ("--device-memory", "1MiB", "--host-memory", "8MiB")


def test_prefetch_depth(tmp_path):
    out = cli_json("tune", "prefetch-depth", *STORE, "--block-size", "64KiB", "--candidates", "0,2",
                   "--steps", "1", "--warmup", "0", "--no-progress", "--offload-dir", str(tmp_path))
    assert out["target"] == "prefetch-depth" and out["best"] in (0, 2)
    m = out["measurements"]
    assert set(m) == {"0", "2"}
    assert m["0"]["issued"] == 0  # depth 0 never prefetches
    assert all(v["hits"] + v["misses"] > 0 for v in m.values())  # every candidate ran offloaded steps
    assert all(m[str(out["best"])]["step_s"] <= v["step_s"] for v in m.values())


def test_block_size_skips_candidates_that_do_not_fit(tmp_path):
    code, out, err = cli("tune", "block-size", *STORE, "--candidates", "32KiB,64KiB,128KiB", "--steps", "1",
                         "--offload-dir", str(tmp_path))
    assert code == 0, err
    # 128 KB blocks: a block's working set is 9 blocks, the tier holds 8
    assert "tune block-size: best" in out and "working set is 9 blocks of 128.0KiB" in out
    assert "tune cache_block_size" not in err  # no progress bar: stderr is not a terminal here


def check_usage_error(args, fragment):
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    assert fragment in err, err


def test_errors_exit_2_naming_the_flag():
    check_usage_error(["tune"], "the following arguments are required: target")
    check_usage_error(["tune", "prefetch-depth", "--candidates", "a,b"], "--candidates 'a,b' for prefetch-depth")
    check_usage_error(["tune", "block-size", "--block-size", "64KiB"], "--block-size sets the block of the prefetch")
    check_usage_error(["tune", "prefetch-depth", "--device-memory", "512KiB", "--block-size", "64KiB"],
                      "cannot run offloaded")
    check_usage_error(["tune", "prefetch-depth", "--model", "a:B"], "give its --inputs")
