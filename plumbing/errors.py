"""The kit's own errors: each a problem the user can fix, with a one-line message that names the file or option
and says what to do; repro.py (only) prints them as one line and exits non-zero. Any other exception is a bug.

    raise errors.DataError(f"{path}: not a readable parquet file; replace or remove it")
"""
import errno


class KitError(Exception):
    """A problem the user can fix; `exit_code` is what repro.py exits with."""
    exit_code = 1


class DataError(KitError):
    """Bad data input: a corpus, a shard, a tokenizer that does not match."""


class CheckpointError(KitError):
    """A checkpoint folder that cannot be read (or written, or used) as asked."""


class TrainingError(KitError):
    """A run that cannot go on: a non-finite loss, a folder that belongs to another config, a full disk."""


class DiskFull(TrainingError):
    """A write that ran out of disk or past a file-size limit; the file it would have replaced is intact."""

    def __init__(self, message: str, errno: int):
        super().__init__(message)
        self.errno = errno


def disk_full_reason(error: BaseException) -> str:
    """Why a write failed if the disk or a file-size limit stopped it ("" otherwise), by errno or message."""
    code = getattr(error, "errno", None)
    if code == errno.ENOSPC or "No space left on device" in str(error):
        return "no space left on device"
    if code == errno.EFBIG or "File too large" in str(error):
        return "a file-size limit (ulimit -f) was reached"
    return ""


class ConfigError(KitError):
    """Run settings that do not make a run (RunConfig's checks)."""


class UsageError(KitError):
    """A command used in a way it cannot work (click's usage errors exit 2 as well)."""
    exit_code = 2


class OptionError(UsageError):
    """A command-line option, or a --set value, that cannot be used."""

    def __init__(self, option: str, message: str):
        super().__init__(f"Invalid value for {option}: {message}")
        self.option = option
