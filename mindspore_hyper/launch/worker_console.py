"""The console of `mindspore-hyper run --processes`: the workers' logs, less MindSpore's start-up notices.

msrun writes each worker's output to `<log_dir>/worker_<rank>.log` and, with `--join=True`, runs
`tail -f` on every log to the console: every worker's MindSpore 2.10 start-up notices arrive
there as `[WARNING]` lines (about 20 per worker, more on a busy machine: one per connection
attempt and per 0.5 s waited for the other workers), lines of different workers can mix
mid-line, and the tails are killed when the workers exit, so a worker's last lines can be lost.
`WorkerConsole` runs msrun without its tails and follows the logs itself: whole lines only, read
to the end after the job, and a line reaches the console unless it is one of `HARMLESS_LINES`,
each matched in full (level, component, source file, function and message text; line numbers and
addresses vary), with the reason it tells the user nothing. Every other line, MindSpore's other
warnings and errors included, is printed; the logs themselves keep every line. `GLOG_v` would
hide the real warnings too. A cluster that does not form is not silent: past a normal start's few
"Topology build timed out" retries, `ClusterFormingWatch` (cluster_forming.py) prints one line
every 20 retries (10 s) to the error stream, naming the waiting workers and what to check.

A failing rank ends the job at once: when a rank reports its failure (`rank_failure.py`) or msrun
reports a worker that exited abnormally (killed by a signal, say), the console stops msrun (its
SIGINT: msrun kills every worker and its scheduler) instead of letting msrun wait for its
scheduler's heartbeat timeout, and keeps the cause in `failure`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import IO, Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.launch.cluster_forming import ClusterFormingWatch
from mindspore_hyper.launch.elastic import WorkerFailure
from mindspore_hyper.launch.rank_failure import clear_rank_failures, find_rank_failure

__all__ = ["HARMLESS_LINES", "is_harmless", "WorkerConsole"]

_HEADER = r"^\[{level}\] {component}\(\d+[,:][0-9a-f]+,(?:python|MainProcess)\):[0-9.:-]+ \[{source}:\d+\] "


def _notice(level: str, component: str, source: str, function: Optional[str], message: str) -> "re.Pattern":
    """The pattern of one MindSpore log line: its header, `function] ` (C++ lines) and `message` in full."""
    head = _HEADER.format(level=level, component=component, source=re.escape(source))
    return re.compile(head + (re.escape(function) + r"\] " if function else "") + message + "$")


_CLUSTER = "mindspore/ccsrc/cluster/"
_CPU_COLLECTIVE = "mindspore/ccsrc/plugin/cpu/res_manager/collective/"
_MSRUN = "mindspore/parallel/cluster/process_entity/_api.py"

# (pattern, why it tells the user nothing); MindSpore 2.10.0's texts.
HARMLESS_LINES: Tuple[Tuple["re.Pattern", str], ...] = (
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "rpc/tcp/tcp_comm.cc", "Connect",
             r"Connection \d+ source: [0-9.]+:\d+, destination: [0-9.]+:\d+"),
     "each TCP connection a worker opens while the cluster forms"),
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "topology/compute_graph_node.cc", "Register",
             r"Failed to connect to the meta server node url: [0-9.]+:\d+"),
     "a worker started before msrun's scheduler listens retries (a scheduler that never answers ends the "
     "job with msrun's error after its --cluster_time_out)"),
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "topology/compute_graph_node.cc", "ReconnectWithTimeoutWindow",
             r"Failed to register and try to reconnect to the meta server\."),
     "the same retry"),
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "topology/cluster_context.cc", "BuildCluster",
             r"Topology build timed out\., retry\(\d+/\d+\)\."),
     "every 0.5 s a worker waits for the others to register (a cluster slow to form gets one line every 20 "
     "retries from ClusterFormingWatch; one that never forms ends the job with msrun's error)"),
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "topology/cluster_context.cc", "BuildCluster",
             r"Cluster is successfully initialized\."),
     "the cluster formed"),
    (_notice("WARNING", "DISTRIBUTED", _CLUSTER + "topology/cluster_context.cc", "PostProcess",
             r"This node \d+ rank id: \d+"),
     "the worker's rank, which msrun's own 'Start worker process with rank id' line already printed"),
    (_notice("WARNING", "DEVICE", _CPU_COLLECTIVE + "allreduce_impl.cc", "Initialize",
             r"The worker node start sync start!"),
     "the CPU collectives' start-up"),
    (_notice("WARNING", "DEVICE", _CPU_COLLECTIVE + "ms_collective_comm_lib.cc", "Initialize",
             r"Mindspore collective communication lib for group mccl_world_group has already been initialized\."),
     "the CPU collectives' start-up, met twice by `mindspore.communication.init()`"),
    (_notice("WARNING", "ME", "mindspore/ccsrc/runtime/hardware_abstract/collective/collective_manager.cc",
             "CreateCommunicationGroup", r"Create collective communication group: \S+ \[const vector\]\{[0-9, ]*\}"
             r"(?:, async: \d+)?"),
     "a communication group made (the world's, or one the script or the package creates)"),
    (_notice("WARNING", "DEVICE", _CPU_COLLECTIVE + "ms_collective_comm_lib.cc", "CreateCommunicationGroup",
             r"The group \S+ has already existed\."),
     "the same group met again while it is made"),
    (_notice("INFO", "DISTRIBUTED", _CLUSTER + "rpc/core/communicator/tcp_client.cc", "Start",
             r"Event base dispatch success!"),
     "a worker's connection thread ends as it exits"),
    (_notice("INFO", "DISTRIBUTED", _CLUSTER + "rpc/core/communicator/tcp_server.cc", "Start",
             r"Event base dispatch success!"),
     "the same, its server side"),
    (_notice("WARNING", "ME", _MSRUN, None, r"Distributed job is spawned\. Waiting all processes to exit\.\.\."),
     "msrun's own notice that it waits for the workers"),
    (_notice("WARNING", "ME", _MSRUN, None,
             r"The '--tail_worker_log' is:\d+, which doesn't contain this worker \d+\. So this worker \d+'s log "
             r"will not be output to console\. Reset '--tail_worker_log', if you want to output this worker's log "
             r"to console\."),
     "msrun's tails are turned off on purpose: WorkerConsole prints the logs"),
)


def is_harmless(line: str) -> bool:
    """Whether `line` (without its newline) is one of `HARMLESS_LINES`, matched in full."""
    return line.startswith("[") and any(pattern.match(line) for pattern, _ in HARMLESS_LINES)


class WorkerConsole:
    """Runs msrun and prints its output and its workers' logs, less `HARMLESS_LINES`.

    Args:
        log_dir: msrun's `--log_dir`.
        workers: the local workers (their logs are `worker_<rank>.log`, msrun's default names).
        out, err: where the lines go (default: this process's stdout and stderr).
        poll_s: how often the logs and the ranks' failure reports are read while the job runs (seconds).

    Attributes:
        failure: why the console ended the job ("rank R failed: Type: message", or the worker msrun
            saw exit abnormally), or None.
    """

    def __init__(self, log_dir: str, workers: int, out: Optional[IO[str]] = None, err: Optional[IO[str]] = None,
                 poll_s: float = 0.2):
        self.paths = [os.path.join(log_dir, f"worker_{rank}.log") for rank in range(workers)]
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.poll_s = poll_s
        self.log_dir = log_dir
        self.failure: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._offsets: Dict[str, int] = {}
        self._partial: Dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.cluster = ClusterFormingWatch()  # its lines go to `err`

    @staticmethod
    def msrun_arguments(workers: int) -> List[str]:
        """msrun's flags for this console: its own tails off (no worker has rank `workers`)."""
        return [f"--tail_worker_log={workers}", "--join=True"]

    def run(self, argv: Sequence[str], env: dict) -> int:
        """Run msrun (`argv`, with `msrun_arguments` among them) to its end, or until a rank fails
        (module docstring); returns msrun's exit status, non-zero when a rank failed."""
        for path in self.paths:  # an earlier job's log must not be printed as this one's (msrun truncates it late)
            if os.path.exists(path):
                os.remove(path)
        clear_rank_failures(self.log_dir)  # nor an earlier job's failure taken for this one's
        process = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   errors="replace")
        self._process = process
        done = threading.Event()
        pumps = [threading.Thread(target=self._pump, args=(process.stdout, self.out), daemon=True),
                 threading.Thread(target=self._pump, args=(process.stderr, self.err), daemon=True),
                 threading.Thread(target=self._follow, args=(done,), daemon=True)]
        for thread in pumps:
            thread.start()
        try:
            code = process.wait()
            return code or (1 if self.failure is not None else 0)
        except KeyboardInterrupt:  # msrun got the same SIGINT and stops its workers
            process.wait()
            raise
        finally:
            done.set()
            for thread in pumps:
                thread.join()
            self._read_logs(final=True)

    def _emit(self, line: str, stream: IO[str], worker: Optional[int] = None) -> None:
        """Print `line` to `stream` unless it is harmless; a line of worker `worker`'s log also
        feeds the cluster watch, whose line goes to the error stream."""
        with self._lock:
            notice = self.cluster.feed(worker, line) if worker is not None else None
            if notice is not None:
                self.err.write(notice + "\n")
                self.err.flush()
            if not is_harmless(line):
                stream.write(line + "\n")
                stream.flush()

    def _pump(self, pipe: IO[str], stream: IO[str]) -> None:
        for line in pipe:
            self._emit(line.rstrip("\n"), stream)
            failed = WorkerFailure.from_log(line)
            if failed is not None:  # the rank's own report (its error), if it wrote one, else msrun's
                reported = find_rank_failure(self.log_dir)
                self._end_job(reported.describe() if reported is not None else failed.describe())

    def _follow(self, done: threading.Event) -> None:
        while not done.wait(self.poll_s):
            self._read_logs(final=False)
            reported = find_rank_failure(self.log_dir)
            if reported is not None:
                self._end_job(reported.describe())

    def _end_job(self, cause: str) -> None:
        """Stop msrun for `cause`, once (its SIGINT handler kills every worker and its scheduler)."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = cause
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)

    def _read_logs(self, final: bool) -> None:
        """Print the complete lines added to each log since the last read (with `final`, a last
        line without its newline too)."""
        for worker, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:  # bytes: a character cut at the end waits for its other bytes
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
                    self._offsets[path] = f.tell()
            except FileNotFoundError:
                continue
            lines = (self._partial.pop(path, b"") + data).split(b"\n")
            if lines[-1] and not final:
                self._partial[path] = lines[-1]
            for line in lines[:-1] + ([lines[-1]] if final and lines[-1] else []):
                self._emit(line.decode("utf-8", errors="replace"), self.out, worker)
