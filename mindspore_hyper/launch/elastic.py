"""`run_elastic`: run a training script under msrun and, when a worker dies, restart the job on
the processes that remain, the way torchelastic restarts its workers.

Each attempt is one `msrun --worker_num=N --local_worker_num=N ... --join=True script args` on
this host, with its own master port and log folder (`<log_dir>/attempt_<k>/`). msrun stops the
whole job when one worker exits abnormally and names it ("Worker process <pid> exit with
exception. Error code: <code>"); from that line the launcher decides:

- a worker killed by a signal (code < 0: SIGKILL, the OOM killer, a lost device) counts as a
  lost process: the next attempt runs on `next_world_size(N, 1, ...)` processes (the largest
  multiple of `nproc_multiple` not above N - 1, at least `min_nproc`), or the job ends;
- a worker exiting with EXIT_CANNOT_RESIZE (its strategy cannot run on N processes, see
  `elastic_strategy`) ends the job;
- any other failure restarts the job on the same N processes.

At most `max_restarts` restarts. The workers resume from the newest committed checkpoint
themselves (`load_checkpoint` reshards it for the new world size); the launcher passes them the
attempt number in MSHYPER_ELASTIC_ATTEMPT. One host only (a launcher per host would need the
hosts to agree on the world size of each attempt, which this launcher does not do).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

from mindspore_hyper.launch.resize import EXIT_CANNOT_RESIZE

__all__ = ["WorkerFailure", "Attempt", "ElasticResult", "ElasticError", "next_world_size", "run_elastic"]

_FAILED_WORKER = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


@dataclass(frozen=True)
class WorkerFailure:
    """The worker msrun saw fail first: its pid and exit code (negative: killed by that signal)."""

    pid: int
    code: int

    @property
    def signal(self) -> Optional[int]:
        """The signal that killed it, or None when it exited with a code."""
        return -self.code if self.code < 0 else None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "unknown"
            return f"worker pid {self.pid} was killed by signal {self.signal} ({name})"
        return f"worker pid {self.pid} exited with code {self.code}"

    @classmethod
    def from_log(cls, text: str) -> Optional["WorkerFailure"]:
        """The failure msrun reports in its output `text`, or None."""
        match = _FAILED_WORKER.search(text)
        return None if match is None else cls(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class Attempt:
    """One msrun launch.

    Attributes:
        index: 0 for the first launch, then 1, 2, ...
        world_size: its number of processes.
        returncode: msrun's exit code (0: the job finished).
        failure: the worker msrun saw fail, or None.
        started, ended: wall-clock times (time.time(), seconds).
        log_dir: msrun's log folder of the attempt (msrun.log holds msrun's own output).
    """

    index: int
    world_size: int
    returncode: int
    failure: Optional[WorkerFailure]
    started: float
    ended: float
    log_dir: str


@dataclass(frozen=True)
class ElasticResult:
    """Every attempt of a job that finished; `world_size` is the last one's."""

    attempts: Tuple[Attempt, ...]

    @property
    def world_size(self) -> int:
        return self.attempts[-1].world_size


class ElasticError(RuntimeError):
    """The job could not finish (the message says why); `attempts` lists what was tried."""

    def __init__(self, message: str, attempts: Sequence[Attempt]):
        super().__init__(message)
        self.attempts = tuple(attempts)


def next_world_size(world_size: int, lost: int, min_nproc: int = 1, multiple: int = 1) -> Optional[int]:
    """The processes to restart with after losing `lost` of `world_size`: the largest multiple
    of `multiple` not above what remains, or None when that is below `min_nproc` (or 0)."""
    remaining = world_size - lost
    size = remaining - remaining % multiple
    return size if size >= max(min_nproc, 1) else None


@dataclass(frozen=True)
class _Msrun:
    """Runs one attempt: msrun with its output in `<log_dir>/msrun.log`; returns (code, output)."""

    executable: str
    timeout: Optional[float] = None

    def __call__(self, args: Sequence[str], env: Dict[str, str], log_dir: str) -> Tuple[int, str]:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, "msrun.log")
        with open(path, "w") as out:
            proc = subprocess.Popen([self.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # msrun's handler kills its workers and scheduler
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                code = -signal.SIGINT
        with open(path) as f:
            return code, f.read()


def run_elastic(script: str, args: Sequence[str] = (), *, nproc: int, log_dir: str, min_nproc: int = 1,
                nproc_multiple: int = 1, max_restarts: int = 3, env: Optional[Dict[str, str]] = None,
                attempt_timeout: Optional[float] = None, log: Callable[[str], None] = None,
                runner: Optional[Callable[[Sequence[str], Dict[str, str], str], Tuple[int, str]]] = None
                ) -> ElasticResult:
    """Run `script args` under msrun on `nproc` local processes, restarting on failures (see
    module docstring).

    Args:
        script: the training script (it resumes from its checkpoint directory itself).
        args: its arguments.
        nproc: processes of the first attempt.
        log_dir: one `attempt_<k>/` folder of msrun logs per attempt.
        min_nproc: the fewest processes worth running on.
        nproc_multiple: world sizes must be multiples of it (the product of the strategy's
            non-data axes, e.g. the tensor-parallel size).
        max_restarts: restarts allowed after the first attempt.
        env: the workers' environment (default: this process's).
        attempt_timeout: seconds one attempt may take (None: no limit); then msrun is interrupted.
        log: where progress lines go (default: stderr).
        runner: runs one attempt (msrun's arguments, environment, log folder) -> (exit code,
            msrun's output); the default starts msrun from this interpreter's bin folder.

    Returns:
        The ElasticResult of the job that finished.

    Raises:
        ValueError: a bad argument (named).
        ElasticError: the job could not finish: restarts exhausted, too few processes left, or
            a worker refused the world size (EXIT_CANNOT_RESIZE).
    """
    for name, value, low in (("nproc", nproc, 1), ("min_nproc", min_nproc, 1), ("nproc_multiple", nproc_multiple, 1),
                             ("max_restarts", max_restarts, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    if nproc % nproc_multiple or nproc < min_nproc:
        raise ValueError(f"nproc={nproc}: expected a multiple of nproc_multiple={nproc_multiple}, at least "
                         f"min_nproc={min_nproc}")
    if not os.path.isfile(script):
        raise ValueError(f"script: {script!r} is not a file")
    log = log or (lambda line: print(f"mindspore_hyper elastic: {line}", file=sys.stderr, flush=True))
    bindir = os.path.dirname(sys.executable)
    runner = runner or _Msrun(os.path.join(bindir, "msrun"), attempt_timeout)
    base_env = dict(os.environ if env is None else env)
    base_env["PATH"] = bindir + os.pathsep + base_env.get("PATH", "")
    attempts = []
    world = nproc
    for index in range(max_restarts + 1):
        attempt_dir = os.path.join(log_dir, f"attempt_{index}")
        attempt_env = dict(base_env, MSHYPER_ELASTIC_ATTEMPT=str(index), MSHYPER_ELASTIC_FIRST_NPROC=str(nproc))
        msrun_args = [f"--worker_num={world}", f"--local_worker_num={world}", f"--master_port={_free_port()}",
                      f"--log_dir={attempt_dir}", "--join=True", script, *map(str, args)]
        log(f"attempt {index}: {world} processes (logs in {attempt_dir})")
        started = time.time()
        code, output = runner(msrun_args, attempt_env, attempt_dir)
        failure = WorkerFailure.from_log(output) if code != 0 else None
        attempts.append(Attempt(index, world, code, failure, started, time.time(), attempt_dir))
        if code == 0:
            log(f"attempt {index}: finished on {world} processes")
            return ElasticResult(tuple(attempts))
        what = failure.describe() if failure is not None else f"msrun exited with code {code} naming no worker"
        if failure is not None and failure.code == EXIT_CANNOT_RESIZE:
            raise ElasticError(f"attempt {index}: a worker cannot run on {world} processes (exit code "
                               f"{EXIT_CANNOT_RESIZE}, see {attempt_dir}): not restarted", attempts)
        if failure is not None and failure.signal is not None:
            smaller = next_world_size(world, 1, min_nproc, nproc_multiple)
            if smaller is None:
                raise ElasticError(f"attempt {index}: {what}; {world - 1} process(es) remain, fewer than the job "
                                   f"needs (at least {min_nproc}, a multiple of {nproc_multiple}): not restarted",
                                   attempts)
            log(f"attempt {index}: {what} (a lost process); restarting on {smaller} processes")
            world = smaller
        else:
            log(f"attempt {index}: {what}; restarting on {world} processes")
    raise ElasticError(f"the job failed {len(attempts)} times (max_restarts={max_restarts}); last: "
                       f"{attempts[-1].failure.describe() if attempts[-1].failure else 'no worker named'}", attempts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
