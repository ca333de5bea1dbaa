"""Kill-and-resume smoke test of examples/pretrain_llama.py under msrun (issue 41, item 7), a CI stage.

Not a pytest module (its name does not match `test_*.py`): its three runs (one process, then two
msrun launches) take about two minutes, over the unit suite's budget. Run as
`.venv/bin/python tests/resume_smoke.py` (CI does, after `make test`). In a temporary folder it

1. writes the example's token file (once, before any worker starts: the workers would race to write it);
2. runs the uninterrupted one-device reference: the example's own reference run (`--devices 1`, one
   process), against which the example checks its parallel runs and `loss_rtol` is derived;
3. starts the example on 4 msrun processes (data 2 x tensor 2, ZeRO-1), a checkpoint every
   SAVE_EVERY steps, polls the checkpoint folder until step KILL_AT or later is committed, and
   SIGKILLs the worker processes of that msrun (its children whose MS_ROLE is MS_WORKER, found in
   its own process tree: msrun starts each worker in a session of its own, so a signal to msrun's
   process group would not reach them);
4. checks that no process of that run is left, and the folder: its newest committed step is one
   this run saved before the kill (>= KILL_AT, < STEPS), every earlier save is committed, and the
   killed workers' logged losses up to it follow the reference;
5. resumes at 2 msrun processes (data 1 x tensor 2) from that step to STEPS and checks that every
   process's losses continue the reference within the example's `loss_rtol`, and that no
   shared-memory segment of the package's (/dev/shm/mshyper_*) was left by either run.

Every subprocess runs under a timeout; on any failure (or SIGTERM) the script kills every process it
started (msrun, its scheduler, workers and log tails, by pid) and exits 1 with the reason. Traffic:
msrun's own, on localhost. `--keep` keeps the temporary folder (logs, checkpoints) for inspection.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Set

import numpy as np
import psutil  # a MindSpore dependency

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "pretrain_llama.py")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(EXAMPLE))
import pretrain_llama  # noqa: E402 (the example's tolerance and token writer, not copies)
from mindspore_hyper.checkpoint.directory import committed_steps, leftovers, newest_step  # noqa: E402
from mindspore_hyper.cli.msrun import msrun_command  # noqa: E402
from mindspore_hyper.comm.shm import SEGMENT_PREFIX  # noqa: E402
from mindspore_hyper.context import HOST_BLOCKING_ENV  # noqa: E402

STEPS, SAVE_EVERY, KILL_AT = 8, 2, 4  # kill once step 4 of 8 is saved: half the run is left to resume
BATCH = 8  # the smallest global batch the example takes at data-parallel 2: 4 micro-batches x 2 ranks
REFERENCE_TIMEOUT_S = 300  # each a hang's limit on 2 loaded cores, several times the runs' measured time
KILLED_RUN_TIMEOUT_S = 300
MSRUN_EXIT_TIMEOUT_S = 60
RESUME_TIMEOUT_S = 300
# The example prints its losses with 7 decimals and its telemetry with 4: comparing two printed values
# adds up to one unit of the last printed decimal (half a unit from each rounding) to the bound.
PRINTED_7, PRINTED_4 = 1e-7, 1e-4


class SmokeFailure(Exception):
    """A check failed or a process misbehaved: the message says which."""


def _segments() -> Set[str]:
    """The package's shared-memory segments now in /dev/shm (`comm.shm.SEGMENT_PREFIX`)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MsrunJob:
    """One msrun launch of the example and every process under it (tracked by pid, with psutil's
    creation-time check, so a reused pid is never signalled)."""

    def __init__(self, workers: int, log_dir: str, args: List[str], cwd: str, env: Dict[str, str]):
        self.workers, self.log_dir = workers, log_dir
        executable, argv, env = msrun_command([f"--worker_num={workers}", f"--local_worker_num={workers}",
                                               f"--master_port={_free_port()}", f"--log_dir={log_dir}",
                                               "--join=True", EXAMPLE, *args], env)
        self.out_path = os.path.join(cwd, f"msrun_{workers}.out")
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(argv, executable=executable, env=env, cwd=cwd, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.known: Dict[int, psutil.Process] = {}
        self.refresh()

    def refresh(self) -> None:
        """Remember every process now under msrun (a worker orphaned by msrun's exit is still known)."""
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self.known.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def worker_processes(self) -> List[psutil.Process]:
        """msrun's children that run the example as workers (MS_ROLE=MS_WORKER; the scheduler is
        MS_SCHED; msrun's `tail -f` of each worker's log inherits MS_WORKER but runs no script)."""
        out = []
        for p in psutil.Process(self.proc.pid).children():
            try:
                if p.environ().get("MS_ROLE") == "MS_WORKER" and EXAMPLE in p.cmdline():
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait(self, timeout: float, what: str) -> int:
        """msrun's exit status, polling its process tree meanwhile; SmokeFailure after `timeout` s."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            self.refresh()
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{what}: msrun did not end within {timeout} s (hang){self.tail()}")
            time.sleep(0.2)
        return self.proc.returncode

    def kill_all(self) -> None:
        """SIGKILL msrun and every process seen under it that is still alive."""
        self.refresh()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for p in self.known.values():
            try:
                p.kill()  # psutil checks the creation time: never a reused pid
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(self.known.values()), timeout=10)

    def log(self, rank: int) -> str:
        path = os.path.join(self.log_dir, f"worker_{rank}.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def tail(self, chars: int = 3000) -> str:
        """The workers' logs without MindSpore's [WARNING] lines, for failure messages."""
        text = ""
        for rank in range(self.workers):
            lines = [line for line in self.log(rank).splitlines() if not line.startswith("[")]
            text += f"\n--- worker {rank}\n" + "\n".join(lines)[-chars:]
        return text


def printed_losses(text: str, where: str) -> List[float]:
    """The losses of the example's `parallel losses:` line in `text`."""
    lines = [line for line in text.splitlines() if line.startswith("parallel losses:")]
    if len(lines) != 1:
        raise SmokeFailure(f"{where}: expected one 'parallel losses:' line, found {len(lines)}")
    return [float(x) for x in lines[0].split(":", 1)[1].split()]


def telemetry_losses(text: str) -> Dict[int, float]:
    """step (0-based) -> loss of the telemetry lines (`step 3 | loss 5.3457 | ...`) in `text`."""
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step (\d+) \| loss ([-\d.]+) \|", text, re.M)}


def check_curve(losses: Dict[int, float], reference: List[float], printed: float, what: str) -> float:
    """Each loss (0-based step -> loss) within the example's `loss_rtol` of the reference's, plus
    `printed` for the printed values' rounding; returns the largest relative difference."""
    rtol = pretrain_llama.loss_rtol("fp32", STEPS, BATCH)
    worst = 0.0
    for step, loss in sorted(losses.items()):
        ref = reference[step]
        if not np.isfinite(loss) or abs(loss - ref) > rtol[step] * abs(ref) + printed:
            raise SmokeFailure(f"{what}: step {step + 1} loss {loss} vs reference {ref}: beyond the derived "
                               f"tolerance {rtol[step]:.2e} relative (+{printed} printed rounding); "
                               f"losses {losses}, reference {reference}")
        worst = max(worst, abs(loss - ref) / abs(ref))
    return worst


def timed(label: str, figures: List[str], start: float) -> None:
    line = f"{label}: {time.monotonic() - start:.1f} s (load average {os.getloadavg()[0]:.2f})"
    figures.append(line)
    print(f"== resume smoke: {line}", flush=True)


def run(work: str, env: Dict[str, str], jobs: List[MsrunJob]) -> List[str]:
    """The smoke test's steps in `work`; appends every msrun launch to `jobs` (for the caller's
    clean-up); returns the timing lines."""
    figures: List[str] = []
    segments_before = _segments()
    tokens, ckpt = os.path.join(work, "tokens.bin"), os.path.join(work, "ckpt")
    pretrain_llama.write_tokens(tokens)
    common = ["--batch", str(BATCH), "--no-check", "--tokens", tokens]

    start = time.monotonic()
    sim_env = {k: v for k, v in env.items() if k != "MS_HYPER_MODE"}
    try:
        done = subprocess.run([sys.executable, EXAMPLE, "--steps", str(STEPS), "--devices", "1", *common],
                              env=sim_env, cwd=work, capture_output=True, text=True, timeout=REFERENCE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"the one-device reference run did not end within {REFERENCE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise SmokeFailure(f"the one-device reference run failed ({done.returncode}): {done.stderr[-3000:]}")
    reference = printed_losses(done.stdout, "the one-device reference run")
    if len(reference) != STEPS:
        raise SmokeFailure(f"the reference run printed {len(reference)} losses, expected {STEPS}")
    timed(f"one-device reference, {STEPS} steps", figures, start)

    start = time.monotonic()
    killed = MsrunJob(4, os.path.join(work, "log4"), ["--steps", str(STEPS), *common, "--ckpt", ckpt,
                                                       "--save-every", str(SAVE_EVERY), "--log-every", "1"], work, env)
    jobs.append(killed)
    deadline = time.monotonic() + KILLED_RUN_TIMEOUT_S
    while (newest_step(ckpt) or 0) < KILL_AT:
        killed.refresh()
        if killed.proc.poll() is not None:
            raise SmokeFailure(f"the 4-process run ended ({killed.proc.returncode}) before step {KILL_AT} was "
                               f"saved{killed.tail()}")
        if time.monotonic() > deadline:
            raise SmokeFailure(f"no checkpoint of step >= {KILL_AT} within {KILLED_RUN_TIMEOUT_S} s{killed.tail()}")
        time.sleep(0.05)
    seen = newest_step(ckpt)
    workers = killed.worker_processes()
    if len(workers) != 4:
        raise SmokeFailure(f"expected 4 live workers under msrun at the kill, found {[p.pid for p in workers]}")
    for p in workers:
        p.kill()  # SIGKILL: a crash, nothing flushed or saved on the way out
    _, alive = psutil.wait_procs(workers, timeout=10)
    if alive:
        raise SmokeFailure(f"workers {[p.pid for p in alive]} outlived SIGKILL by 10 s")
    timed(f"4-process run until step {seen} was saved, workers killed", figures, start)
    start = time.monotonic()
    try:
        msrun_rc: Optional[int] = killed.wait(MSRUN_EXIT_TIMEOUT_S, "after its workers were killed")
    except SmokeFailure:
        msrun_rc = None  # msrun keeps waiting on its dead workers: stop it and what is left under it
    killed.kill_all()
    alive = [p.pid for p in killed.known.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if alive:
        raise SmokeFailure(f"processes of the killed run still alive after the kill: pids {alive}")
    timed(f"msrun's end after the kill (exit status {msrun_rc if msrun_rc is not None else 'none: killed'})",
          figures, start)
    logs = [killed.log(rank) for rank in range(4)]
    if any("parallel losses:" in text for text in logs):
        raise SmokeFailure(f"a worker finished its {STEPS} steps before the kill: not a mid-run kill")

    steps = sorted(committed_steps(ckpt))
    newest = newest_step(ckpt)
    if newest is None or not KILL_AT <= newest < STEPS:
        raise SmokeFailure(f"the newest committed step is {newest}: expected {KILL_AT} <= step < {STEPS}")
    if steps != list(range(SAVE_EVERY, newest + 1, SAVE_EVERY)):
        raise SmokeFailure(f"committed steps {steps}: expected every {SAVE_EVERY} up to {newest}")
    before = telemetry_losses(logs[0])
    if sorted(before)[:newest] != list(range(newest)):
        raise SmokeFailure(f"worker 0 logged steps {sorted(before)}: expected 0..{newest - 1} at least")
    worst_before = check_curve(before, reference, PRINTED_4, "the 4-process run before the kill")
    print(f"== resume smoke: killed after worker 0 logged step {max(before) + 1}; committed steps {steps}, "
          f"newest {newest}, leftovers {leftovers(ckpt)}; its logged losses within {worst_before:.1e} of the "
          f"reference", flush=True)

    start = time.monotonic()
    resumed = MsrunJob(2, os.path.join(work, "log2"), ["--steps", str(STEPS - newest), "--devices", "2", *common,
                                                        "--resume", ckpt], work, env)
    jobs.append(resumed)
    rc = resumed.wait(RESUME_TIMEOUT_S, "the 2-process resume")
    if rc != 0:
        raise SmokeFailure(f"the 2-process resume failed (msrun exit status {rc}){resumed.tail()}")
    timed(f"2-process resume, steps {newest + 1}-{STEPS}", figures, start)
    worst = 0.0
    for rank in range(2):
        losses = printed_losses(resumed.log(rank), f"the resume's worker {rank}")
        if len(losses) != STEPS - newest:
            raise SmokeFailure(f"the resume's worker {rank} printed {len(losses)} losses, expected {STEPS - newest}")
        worst = max(worst, check_curve(dict(zip(range(newest, STEPS), losses)), reference, PRINTED_7,
                                       f"the resume's worker {rank}"))
    segments = _segments() - segments_before
    if segments:
        raise SmokeFailure(f"shared-memory segments left in /dev/shm after both runs: {sorted(segments)}")
    print(f"== resume smoke: resumed steps {newest + 1}-{STEPS} on 2 processes within {worst:.1e} relative of the "
          f"one-device reference (loss_rtol allows {pretrain_llama.loss_rtol('fp32', STEPS, BATCH)[newest]:.1e} "
          f"at step {newest + 1})", flush=True)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, checkpoints)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ms_hyper_resume_smoke.")
    env = dict(os.environ, MS_HYPER_MODE="distributed")
    env.setdefault(HOST_BLOCKING_ENV, "1")  # as the tests run msrun: synchronous kernels, no spinning threads
    jobs: List[MsrunJob] = []

    def on_term(signum, frame):
        raise SmokeFailure(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    start = time.monotonic()
    try:
        figures = run(work, env, jobs)
    except (SmokeFailure, KeyboardInterrupt) as e:
        print(f"resume smoke FAILED: {e or 'interrupted'}", file=sys.stderr, flush=True)
        return 1
    finally:
        for job in jobs:
            job.kill_all()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"resume smoke passed in {time.monotonic() - start:.1f} s; " + "; ".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
