"""The job token: a random secret shared by the processes of one job and mixed into the names of
their shared-memory segments (`shm.segment_name`), so that no other local user can predict a
job's segment names -- and so neither pre-create one to block the job nor offer one to feed it.

Where a process gets it, in this order:

1. ``MSHYPER_JOB_TOKEN`` in its environment: the launcher's environment (export one before
   msrun to share it explicitly), or the environment a parent process put it in (3.).
2. Under msrun without it: a rendezvous file in a directory private to this user
   (``$XDG_RUNTIME_DIR/mindspore_hyper`` or ``~/.cache/mindspore_hyper/run``, mode 0700, owner
   checked), which the host's first worker (local rank 0: msrun's DEVICE_ID) writes (`job_token`,
   called by `World.from_env`) and the host's other workers wait for. The file is named by the
   host and the msrun process (pid and start time: every local worker's parent), so two jobs, a
   crashed job's leftover, or another host's msrun on a shared file system never share one; its
   writer removes it at exit, and the next writer removes those of finished jobs. Shared-memory
   groups never span hosts, so each host's token is its own.
3. Otherwise (a process outside msrun): a fresh token, put into this process's environment when
   this module is imported, so that the processes it starts afterwards (multiprocessing,
   subprocess) share it. Processes started separately must be given the same value (1.).

Only this user (and root) can read a process's environment or the private directory.
"""
from __future__ import annotations

import atexit
import os
import re
import secrets
import socket
import stat
import time
from typing import Optional

__all__ = ["ENV", "job_token", "token_dir"]

ENV = "MSHYPER_JOB_TOKEN"
_TOKEN = re.compile(r"[0-9a-f]{32,128}")
_POLL_S = 0.005


def _check(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"{where}: the job token must be 32 to 128 lowercase hex digits, got {len(token)} characters "
                         f"(generate one with: python -c 'import secrets; print(secrets.token_hex(16))')")
    return token


def _private(path: str) -> bool:
    """Whether `path` is a directory of this user that no one else may enter (not a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0


def token_dir() -> str:
    """This user's private directory of rendezvous files (created mode 0700).

    Raises:
        PermissionError: no candidate is a directory of this user closed to others (names them).
    """
    candidates = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private(runtime):
        candidates.append(os.path.join(runtime, "mindspore_hyper"))
    candidates.append(os.path.join(os.path.expanduser("~"), ".cache", "mindspore_hyper", "run"))
    for path in candidates:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if _private(path):
            return path
    raise PermissionError(f"no private directory for the job token's rendezvous: {', '.join(candidates)} must be "
                          f"directories of uid {os.geteuid()} with mode 0700; or export {ENV} before msrun")


def _start_time(pid: int) -> Optional[str]:
    """The start time of process `pid` (clock ticks since boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _local_rank() -> int:
    """This worker's index among its msrun's workers on this host (msrun sets DEVICE_ID to it)."""
    return int(os.environ.get("DEVICE_ID", os.environ.get("RANK_ID", "0")))


def _rendezvous_name() -> str:
    """The rendezvous file of this msrun job: host, msrun's pid and start time (every worker's parent)."""
    parent = os.getppid()
    return f"{socket.gethostname()}_{parent}_{_start_time(parent)}.token"


def _remove_finished(directory: str) -> None:
    """Remove the rendezvous files whose msrun process is gone (or is another process now)."""
    for entry in os.listdir(directory):
        parts = entry[:-len(".token")].rsplit("_", 2) if entry.endswith(".token") else []
        if len(parts) == 3 and parts[0] == socket.gethostname() and parts[1].isdigit():
            if _start_time(int(parts[1])) != parts[2]:
                try:
                    os.unlink(os.path.join(directory, entry))
                except FileNotFoundError:
                    pass


def _publish(path: str, token: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))


def _read(path: str) -> Optional[str]:
    """The token in rendezvous file `path` (None while it does not exist); checks owner and mode."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o600:
            raise PermissionError(f"{path}: owner uid {st.st_uid}, mode {oct(stat.S_IMODE(st.st_mode))}; expected "
                                  f"uid {os.geteuid()}, mode 0o600")
        return _check(os.read(fd, 256).decode("ascii", "replace"), path)
    finally:
        os.close(fd)


def job_token(timeout: float = 60.0) -> str:
    """This job's token (see module docstring); put into this process's environment once known.

    Args:
        timeout: seconds a worker other than local rank 0 waits for its rendezvous file (msrun only).

    Returns:
        The token: lowercase hex digits.

    Raises:
        ValueError: ``MSHYPER_JOB_TOKEN`` is set but malformed.
        TimeoutError: under msrun, local rank 0 did not publish the token within `timeout` (names the file).
        PermissionError: no private directory for the rendezvous (see `token_dir`).
    """
    token = os.environ.get(ENV)
    if token:
        return _check(token, ENV)
    if "MS_ROLE" not in os.environ:
        token = secrets.token_hex(16)
    else:
        directory = token_dir()
        path = os.path.join(directory, _rendezvous_name())
        if _local_rank() == 0:
            _remove_finished(directory)
            token = secrets.token_hex(16)
            _publish(path, token)
        else:
            deadline = time.monotonic() + timeout
            while (token := _read(path)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"local rank {_local_rank()}: local rank 0 did not publish the job token in "
                                       f"{path} within {timeout:g} s (is it running? or export {ENV} before msrun)")
                time.sleep(_POLL_S)
    os.environ[ENV] = token
    return token


if ENV not in os.environ and "MS_ROLE" not in os.environ:
    job_token()  # before this process starts others: they inherit it
