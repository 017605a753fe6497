"""What the kit says about a path the file system refused: the folder a command writes to checked once
(writable_dir, safe when every rank of a launch probes it at once), and an OSError's path, reason and fix in
one line (repro.py prints path_problem instead of a traceback)."""

import errno
import os
import tempfile
from pathlib import Path

from plumbing import errors


def writable_dir(path: Path, option: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        # A name of this process's own: the ranks of a launch probe one shared folder at once.
        tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-").close()
    except OSError as e:
        raise errors.OptionError(option, f"{path} is not a writable folder ({path_reason(e)}); choose another") from None
    return path


# What to do about a path that is not what the kit needs, by the file system's answer.
PATH_FIXES = {errno.EISDIR: "a folder stands where the kit writes a file: move it away and rerun",
              errno.ENOTDIR: "a file stands where the kit needs a folder: move it away, or choose another folder",
              errno.ELOOP: "a symbolic link that leads back to itself: remove it, or point it at a folder",
              errno.ENAMETOOLONG: "a name longer than the file system allows (255 bytes a name): choose a shorter path",
              errno.ENOENT: "check the path", errno.EACCES: "choose a folder you can write to",
              errno.EROFS: "choose a folder you can write to"}


def path_reason(e: OSError) -> str:
    """The file system's reason, with the cause a bare "File exists" hides (mkdir of a dangling or looping link)."""
    path = e.filename2 or e.filename
    if e.errno == errno.EEXIST and path is not None and os.path.islink(path):
        try:
            os.stat(path)
        except OSError as target:
            if target.errno == errno.ELOOP:
                return "a symbolic link loop"
            return f"a symbolic link to {os.readlink(path)}, which does not exist (an unmounted disk?)"
    if e.errno == errno.EEXIST and path is not None and os.path.isfile(path):
        return "a file, where a folder goes"
    return e.strerror or type(e).__name__


def path_problem(e: OSError) -> str:
    """One line for an OSError about a path: the path, why, and what to do."""
    path = e.filename2 or e.filename  # a rename names its target second: the path the user sees
    reason = path_reason(e)
    code = errno.ELOOP if "loop" in reason else errno.ENOTDIR if "where a folder goes" in reason else e.errno
    fix = ("mount it, or remove the link" if "does not exist" in reason
           else PATH_FIXES.get(code, "check the path and the folder's permissions"))
    return f"{path}: {reason}; {fix}"
