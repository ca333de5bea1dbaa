"""`mindspore-hyper timeline` through the installed console script."""
import json

from cli_run import cli, cli_json


def test_1f1b_bubble_matches_the_published_formula(tmp_path):
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    result = cli_json("timeline", "1f1b", "--stages", "4", "--microbatches", "8", "--png", str(png),
                      "--trace", str(trace))
    # unit costs, no p2p: every rank idles (p - 1)(F + B + W) = 3 * 3 = 9; makespan m(F+B+W) + 9 = 33
    assert result["bubble_time"] == [9, 9, 9, 9] and result["makespan"] == 33
    assert result["peak_inflight"] == [4, 3, 2, 1]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())
    spans = [e for e in events["traceEvents"] if e["ph"] == "X"]  # complete events, one per action
    compute = [e for e in spans if e["cat"] in ("forward", "backward")]
    # 4 stages x 8 microbatches x (forward, backward); 3 boundaries x 8 x 2 directions x (send, recv)
    assert len(compute) == 4 * 8 * 2 and len(spans) - len(compute) == 3 * 8 * 2 * 2
    assert {"name", "ts", "dur", "pid", "tid"} <= set(spans[0])


def test_text_output_and_bad_requests():
    code, out, _ = cli("timeline", "interleaved_1f1b", "--stages", "4", "--microbatches", "8", "--chunks", "2")
    assert code == 0 and "bubble fraction" in out
    code, _, err = cli("timeline", "zb_v", "--stages", "4", "--microbatches", "8")
    assert code == 2 and "num_chunks=1" in err and "exactly 2 chunks" in err
    code, _, err = cli("timeline", "1f1b", "--stages", "4", "--microbatches", "8", "--forward", "-1")
    assert code == 2 and "--forward" in err and ">= 0" in err
    code, _, err = cli("timeline", "gpipe", "--microbatches", "8")
    assert code == 2 and "--stages" in err
