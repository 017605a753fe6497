"""One writer per folder: a run folder, or a scale's shared data or teacher, is held by one process at a
time through an flock on a lock file beside it (never inside: --force may delete the folder). Who is waited for,
for how long, and what is said: docs/reliability.md, "Two processes, one folder".

    with locks.held([run_dir, data_dir], wait=True):   # in path order; another holder is waited for
        ...

Anyone who can write to the runs folder can put something at a lock's path: the kit writes only into a lock
file it created itself (O_EXCL), never follows a symbolic link there, and refuses anything but a plain file;
what a holder wrote is read back as data (one line, control characters escaped). Where the filesystem has no
flock (Lustre, or NFS without it) the lock file's existence is the lock.
"""

import errno
import fcntl
import json
import math
import os
import socket
import stat
import sys
import threading
import time
from collections import deque
from contextlib import ExitStack, contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Iterator

from plumbing.errors import OptionError, TrainingError

FLOCK_UNSUPPORTED = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK}
LOCK_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO there never blocks
WAIT_VARIABLE, DEFAULT_WAIT_SECONDS = "NORMGROW_LOCK_WAIT", 600.0
POLL_SECONDS = 1.0
# A holder's sign of life: its lock file's modification time, set every this many seconds. On NFS the
# server sets it from its own clock and clients may cache it ~60 s; 600 s of silence is neither.
HEARTBEAT_SECONDS = 30.0


def lock_file(folder: Path) -> Path:
    return Path(folder).parent / f".{Path(folder).name}.lock"


def printable(text: str, limit: int = 300) -> str:
    """Text someone else wrote, shown as data: one line, control characters escaped, at most `limit` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def wait_seconds() -> float:
    """$NORMGROW_LOCK_WAIT: how long a holder this host cannot see alive is waited for once its file stops changing."""
    if not (text := os.environ.get(WAIT_VARIABLE, "").strip()):
        return DEFAULT_WAIT_SECONDS
    try:
        seconds = math.inf if text == "forever" else float(text)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:
        raise OptionError(WAIT_VARIABLE, f"{printable(text, 40)}: expected seconds (>= 0) or 'forever'")
    return seconds


def _write_record(fd: int):
    """Who holds the lock, for a waiter's message; a full disk leaves the file empty, and the lock holds."""
    record = {"host": socket.gethostname(), "pid": os.getpid(), "command": " ".join(sys.argv),
              "since": datetime.now().astimezone().isoformat(timespec="seconds")}
    with suppress(OSError):
        os.pwrite(fd, json.dumps(record).encode(), 0)


def _holder(fd: int) -> tuple[str, dict]:
    """(who holds it, in words; the record read back, {} if it is not the kit's)."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    try:
        record = json.loads(text)
        said = f"process {record['pid']} on {record['host']} since {record['since']} ({record['command']})"
    except (ValueError, TypeError, KeyError, RecursionError):  # not the kit's record: shown as it is
        record, said = {}, text
    return printable(said) or "another process", record


def _on_this_host(record: dict) -> bool:
    return record.get("host") == socket.gethostname() and type(record.get("pid")) is int


class Silence:
    """How long a lock file has gone without its holder's heartbeat, by this waiter's clock (the file's time is
    its writer host's: only a change of it is read)."""

    def __init__(self):
        self.seen, self.since = None, time.monotonic()

    def seconds(self, lock: Path) -> float:
        try:
            stamp = os.lstat(lock).st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp != self.seen:
            self.seen, self.since = stamp, time.monotonic()
        return time.monotonic() - self.since


def _check_overdue(folder: Path, lock: Path, holder: str, record: dict, silence: Silence, limit: float):
    """Ends a wait for a holder not seen alive once its lock file has not changed for `limit` s."""
    if silence.seconds(lock) >= limit and not (_on_this_host(record) and alive(record["pid"])):
        raise TrainingError(f"{folder}: held by {holder}, whose lock file has not changed for {limit:g} s "
                            f"({WAIT_VARIABLE}); gave up. If that job is gone (one killed on another node leaves its "
                            f"lock on a shared filesystem), remove {lock} and rerun; if it still runs, wait for it "
                            f"with {WAIT_VARIABLE}=forever") from None


def _taken_over(folder: Path, holder: str) -> str:
    return f"{folder}: its lock was left by {holder}, which is gone; taking it over"


def _not_a_lock(lock: Path, folder: Path) -> TrainingError:
    try:
        info = os.lstat(lock)
        kind = ("a symbolic link" if stat.S_ISLNK(info.st_mode) else "a folder" if stat.S_ISDIR(info.st_mode)
                else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a hard link to another file"
                if stat.S_ISREG(info.st_mode) else "not a plain file")
    except OSError:
        kind = "not a plain file"
    return TrainingError(f"{lock}: the lock file of {folder} is {kind}; the kit locks only a plain file it makes "
                         "there itself: remove it and rerun")


def _open_lock(lock: Path, folder: Path) -> tuple[int, bool]:
    """(fd, made by us) of the lock file, made anew (with its folder) where it vanishes meanwhile."""
    while True:
        try:
            return os.open(lock, LOCK_FLAGS | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileNotFoundError:  # another process removed the empty parent it had made
            lock.parent.mkdir(parents=True, exist_ok=True)
            continue
        except FileExistsError:
            pass
        try:
            fd = os.open(lock, LOCK_FLAGS)
            break
        except FileNotFoundError:  # removed by its holder meanwhile
            continue
        except OSError:  # ELOOP: a symbolic link; EISDIR: a folder; ENXIO: a socket
            raise _not_a_lock(lock, folder) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise _not_a_lock(lock, folder)
    return fd, False


def _names(lock: Path, fd: int) -> bool:
    """Whether the path still names the file of fd (its holder may have removed it while we waited)."""
    try:
        a, b = os.lstat(lock), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _lock(lock: Path, folder: Path, limit: float | None, say) -> int:
    """An fd holding the flock of `lock`, a file we created, with our record in it (`limit` None: no waiting)."""
    silence = Silence()
    while True:
        fd, made = _open_lock(lock, folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                _wait_for_flock(fd, lock, folder, silence, limit, say)
            except BaseException:  # not to be waited for (longer), or interrupted
                os.close(fd)
                raise
        except OSError as e:
            if e.errno not in FLOCK_UNSUPPORTED:
                raise
            if made:
                lock.unlink(missing_ok=True)
            os.close(fd)
            return _exclusive_lock(lock, folder, silence, limit, say)
        if _names(lock, fd):
            if made:
                _write_record(fd)
                return fd
            holder, record = _holder(fd)
            if record:
                say(_taken_over(folder, holder))
            lock.unlink()  # a stale file, its holder killed: ours is made anew, so we write only into our own
        os.close(fd)


def _wait_for_flock(fd: int, lock: Path, folder: Path, silence: Silence, limit: float | None, say):
    """Until fd's flock is ours; raises if it is not to be waited for (longer)."""
    holder, record = _holder(fd)
    if limit is None:
        raise TrainingError(f"{folder}: in use by {holder}; wait until it finishes (or stop it), or "
                            "rerun without --no-wait to wait for it")
    say(f"{folder}: in use by {holder}; waiting for it to finish")
    while True:
        try:
            return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # read again: a holder that had only just made the file writes its record next
            _check_overdue(folder, lock, *_holder(fd), silence, limit)
            time.sleep(POLL_SECONDS)


_FLOCKLESS: set[str] = set()  # mounts found without flock, in this process


def _exclusive_lock(lock: Path, folder: Path, silence: Silence, limit: float | None, say) -> int:
    """The lock where the filesystem has no flock: the lock file made with O_EXCL (atomic on NFS and Lustre) until
    its holder removes it; a holder on this host that is gone left it stale."""
    mount = mount_of(lock.parent)
    if mount not in _FLOCKLESS:  # said once per mount, not once per folder held there
        _FLOCKLESS.add(mount)
        say(f"{lock.parent}: its filesystem ({mount}) does not support flock; locking by creating lock files (such as "
            f"{lock.name}) instead; one left by a process killed on another host must be removed by hand")
    waiting = False
    while True:
        fd, made = _open_lock(lock, folder)
        if made:
            _write_record(fd)
            return fd
        holder, record = _holder(fd)
        os.close(fd)
        if _on_this_host(record) and not alive(record["pid"]):
            say(_taken_over(folder, holder))
            lock.unlink(missing_ok=True)
            continue
        if limit is None:
            raise TrainingError(f"{folder}: in use by {holder}; wait until it finishes (or stop it; if it is gone, "
                                f"remove {lock}), or rerun without --no-wait to wait for it")
        if not waiting:
            say(f"{folder}: in use by {holder}; waiting for it to finish (if it is gone, remove {lock})")
            waiting = True
        _check_overdue(folder, lock, holder, record, silence, limit)
        time.sleep(POLL_SECONDS)


# The largest pid a process can have (Linux's PID_MAX_LIMIT is 2**22; pid_t is 32 bits everywhere).
PID_MAX = 2**31 - 1


def alive(pid: int) -> bool:
    """Whether a process of this pid runs on this host (0 and below would signal a process group: no one's)."""
    if not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def mount_of(path: Path) -> str:
    """The mount point holding `path`, with its filesystem type where /proc/mounts says."""
    point = Path(path).resolve()
    while not os.path.ismount(point):
        point = point.parent
    try:
        kinds = {fields[1]: fields[2] for fields in map(str.split, Path("/proc/mounts").read_text().splitlines())
                 if len(fields) > 2}
    except OSError:
        kinds = {}
    return f"{point}, {kinds[str(point)]}" if str(point) in kinds else str(point)


def busy(folder) -> bool:
    """Whether some process holds `folder` now (a look, not a wait: nothing is made, taken or removed)."""
    try:
        fd = os.open(lock_file(Path(folder).resolve()), LOCK_FLAGS)
    except OSError:  # no lock file (or something the kit would refuse to lock: held() says so)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two lookers never see each other as holders
        return False
    except BlockingIOError:
        return True
    except OSError as e:  # no flock here: the lock file's existence is the lock
        return e.errno in FLOCK_UNSUPPORTED
    finally:
        os.close(fd)  # releases the look's shared lock, if it took one


def free_first(folders) -> Iterator[int]:
    """The indices of `folders`, one another process holds put after the others (looked at again in its turn), so that
    processes working through the same list train different folders; once only held ones are left, the first is given."""
    queue, deferred = deque(range(len(folders))), 0
    while queue:
        i = queue.popleft()
        if deferred < len(queue) and busy(folders[i]):
            queue.append(i)
            deferred += 1
            continue
        deferred = 0
        yield i


@contextmanager
def held(folders, wait: bool = True, say=print):
    """Hold every folder of `folders`, in path order (two processes never wait on each other)."""
    limit = wait_seconds() if wait else None
    with ExitStack() as stack:
        fds = []
        for folder in sorted({Path(f).resolve() for f in folders}):
            lock = lock_file(folder)
            made = [p for p in (lock.parent, *lock.parent.parents) if not p.exists()]
            lock.parent.mkdir(parents=True, exist_ok=True)
            fds.append(_lock(lock, folder, limit, say))
            stack.callback(_remove_empty, made)
            stack.callback(os.close, fds[-1])
            stack.callback(lock.unlink, missing_ok=True)  # first, while still held: no one locks the file we remove
        stack.enter_context(_heartbeat(fds))
        yield


@contextmanager
def _heartbeat(fds):
    """Touches the held lock files every HEARTBEAT_SECONDS: a waiter elsewhere can tell a job at work from a dead one."""
    stop = threading.Event()

    def beat():
        while not stop.wait(HEARTBEAT_SECONDS):
            for fd in fds:
                with suppress(OSError):  # a full or read-only filesystem: the lock holds, the heartbeat is missed
                    os.utime(fd)
    thread = threading.Thread(target=beat, name="lock heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _remove_empty(made):
    """The parents held() made for a lock file, removed again if nothing was put in them."""
    for folder in made:  # innermost first
        try:
            folder.rmdir()
        except OSError:
            return
