"""`mindspore-hyper run --processes`'s console (issue 42: ~20 MindSpore start-up [WARNING] lines per
worker reached it): exactly the listed start-up notices are dropped, every other line is printed,
whole lines only, to the end of each log."""
import io
import sys
import textwrap

from mindspore_hyper.launch.worker_console import HARMLESS_LINES, WorkerConsole, is_harmless

# Lines as MindSpore 2.10.0 wrote them in a 4-process `run --processes` job on this machine.
STARTUP = [
    "[WARNING] DISTRIBUTED(3962,7f4f4c811b80,python):2026-12-07-01:54:39.587.292 [mindspore/ccsrc/cluster/rpc/tcp/"
    "tcp_comm.cc:485] Connect] Connection 11 source: 127.0.0.1:58110, destination: 127.0.0.1:39441",
    "[WARNING] DISTRIBUTED(3962,7f4f4c811b80,python):2026-12-07-01:54:39.633.672 [mindspore/ccsrc/cluster/topology/"
    "compute_graph_node.cc:193] Register] Failed to connect to the meta server node url: 127.0.0.1:39441",
    "[WARNING] DISTRIBUTED(3962,7f4f4c811b80,python):2026-12-07-01:54:39.633.728 [mindspore/ccsrc/cluster/topology/"
    "compute_graph_node.cc:392] ReconnectWithTimeoutWindow] Failed to register and try to reconnect to the meta server.",
    "[WARNING] DISTRIBUTED(3962,7f4f4c811b80,python):2026-12-07-01:54:40.215.354 [mindspore/ccsrc/cluster/topology/"
    "cluster_context.cc:316] BuildCluster] Topology build timed out., retry(1/1200).",
    "[WARNING] DISTRIBUTED(3964,7f6f4cbccb80,python):2026-12-07-01:54:41.619.621 [mindspore/ccsrc/cluster/topology/"
    "cluster_context.cc:319] BuildCluster] Cluster is successfully initialized.",
    "[WARNING] DISTRIBUTED(3964,7f6f4cbccb80,python):2026-12-07-01:54:41.619.666 [mindspore/ccsrc/cluster/topology/"
    "cluster_context.cc:428] PostProcess] This node 1 rank id: 1",
    "[WARNING] DEVICE(3964,7f6f4cbccb80,python):2026-12-07-01:54:41.619.805 [mindspore/ccsrc/plugin/cpu/res_manager/"
    "collective/allreduce_impl.cc:54] Initialize] The worker node start sync start!",
    "[WARNING] DEVICE(3962,7f4f4c811b80,python):2026-12-07-01:54:44.727.389 [mindspore/ccsrc/plugin/cpu/res_manager/"
    "collective/ms_collective_comm_lib.cc:58] Initialize] Mindspore collective communication lib for group "
    "mccl_world_group has already been initialized.",
    "[WARNING] ME(3962,7f4f4c811b80,python):2026-12-07-01:54:44.727.463 [mindspore/ccsrc/runtime/hardware_abstract/"
    "collective/collective_manager.cc:368] CreateCommunicationGroup] Create collective communication group: "
    "mccl_world_group [const vector]{0, 1, 2, 3}, async: 0",
    "[WARNING] DEVICE(3962,7f4f4c811b80,python):2026-12-07-01:54:44.727.484 [mindspore/ccsrc/plugin/cpu/res_manager/"
    "collective/ms_collective_comm_lib.cc:152] CreateCommunicationGroup] The group mccl_world_group has already existed.",
    "[INFO] DISTRIBUTED(3964,7f6f1da4d6c0,python):2026-12-07-01:54:47.846.513 [mindspore/ccsrc/cluster/rpc/core/"
    "communicator/tcp_client.cc:367] Start] Event base dispatch success!",
    "[INFO] DISTRIBUTED(3964,7f6f1e24e6c0,python):2026-12-07-01:54:47.846.596 [mindspore/ccsrc/cluster/rpc/core/"
    "communicator/tcp_server.cc:314] Start] Event base dispatch success!",
    "[WARNING] ME(3877:139934616611712,MainProcess):2026-12-07-01:54:28.860.000 [mindspore/parallel/cluster/"
    "process_entity/_api.py:275] Distributed job is spawned. Waiting all processes to exit...",
    "[WARNING] ME(3877:139934616611712,MainProcess):2026-12-07-01:54:28.861.000 [mindspore/parallel/cluster/"
    "process_entity/_api.py:112] The '--tail_worker_log' is:4, which doesn't contain this worker 0. So this worker "
    "0's log will not be output to console. Reset '--tail_worker_log', if you want to output this worker's log to "
    "console.",
]
# Real warnings: another MindSpore C++ warning (a peer that disconnected), a listed notice with other
# text after it, a listed text from another source file, a Python warning through MindSpore's logger.
REAL = [
    "[WARNING] DISTRIBUTED(4852,7fe959f536c0,python):2026-12-07-01:55:23.687.768 [mindspore/ccsrc/cluster/rpc/tcp/"
    "connection.cc:79] SocketEventHandler] Event value fd: 8, events: 1, state: 4, errcode: 0, errno: 0 Success, "
    "remote peer: 127.0.0.1:42966, type:1, remote: 1, count: 1, this peer: 127.0.0.1:37125, please check remote "
    "peer address: 127.0.0.1:42966 in worker log to find out which worker disconnected.",
    STARTUP[3].replace("retry(1/1200).", "retry(1/1200). Cluster size mismatch"),
    STARTUP[6].replace("allreduce_impl.cc", "allgather_impl.cc"),
    "[WARNING] ME(9222:140711316585344,MainProcess):2026-12-07-02:01:18.864.000 [/tmp/train.py:7] rank 0: loss is nan",
    "[ERROR] DISTRIBUTED(3962,7f4f4c811b80,python):2026-12-07-01:54:39.587.292 [mindspore/ccsrc/cluster/topology/"
    "compute_graph_node.cc:193] Register] Failed to connect to the meta server node url: 127.0.0.1:39441",
]


def test_only_the_listed_startup_notices_are_harmless():
    assert all(is_harmless(line) for line in STARTUP)
    assert not any(is_harmless(line) for line in REAL)
    assert not is_harmless("step 3: loss 0.25") and not is_harmless("")
    assert all(reason for _, reason in HARMLESS_LINES)  # each listed with why


def test_console_prints_whole_lines_of_every_log_and_msrun_less_the_notices(tmp_path):
    """A stand-in for msrun: it writes two worker logs (a line in two pieces, a last line without
    its newline) and its own output; an earlier job's log in the folder is not shown."""
    (tmp_path / "worker_1.log").write_text("an earlier job's line\n")
    fake_msrun = textwrap.dedent(f"""
        import sys, time
        logs = [open({str(tmp_path / 'worker_0.log')!r}, "w"), open({str(tmp_path / 'worker_1.log')!r}, "w")]
        print("Start worker process with rank id:0", flush=True)
        print({STARTUP[-2]!r}, file=sys.stderr, flush=True)
        logs[0].write({STARTUP[0]!r} + "\\nrank 0: step 1 lo"); logs[0].flush()
        time.sleep(0.5)
        logs[0].write("ss 0.5\\n" + {REAL[0]!r} + "\\n" + {STARTUP[4]!r} + "\\n"); logs[0].flush()
        logs[1].write({STARTUP[8]!r} + "\\nrank 1: done without newline"); logs[1].flush()
        print("msrun: a real error", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    out, err = io.StringIO(), io.StringIO()
    code = WorkerConsole(str(tmp_path), 2, out=out, err=err, poll_s=0.05).run([sys.executable, "-c", fake_msrun], {})
    assert code == 3
    lines = out.getvalue().splitlines()  # msrun's own line and the logs' come from different threads
    assert sorted(lines) == sorted(["Start worker process with rank id:0", "rank 0: step 1 loss 0.5", REAL[0],
                                    "rank 1: done without newline"])
    assert lines.index("rank 0: step 1 loss 0.5") < lines.index(REAL[0])  # each log in its order
    assert err.getvalue().splitlines() == ["msrun: a real error"]
    assert WorkerConsole.msrun_arguments(4) == ["--tail_worker_log=4", "--join=True"]
