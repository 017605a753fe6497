"""Files and checkpoint folders on disk: the kit's one atomic write (every file it writes goes through write_atomic or a
folder renamed into place), sha256 checksums written with every checkpoint and checked on every load, config.json and
safetensors tensors (one file or an index with shards). Nothing here unpickles anything.

    checkpoint.write_atomic(path, text)                # a temporary file, fsynced, renamed over path
    checkpoint.load_tensors(module, path, dtype, device, name_in_file)
"""

import hashlib
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from plumbing.errors import CheckpointError, DiskFull, disk_full_reason
from plumbing.locks import printable

# Writing a file: whole or not at all, even through a kill, a full disk or another process writing it

def write_atomic(path, content: str | bytes) -> Path:
    """Write `content` to `path` so that no reader ever sees part of it: into a temporary sibling of this
    process's, fsynced, renamed over `path`. If anything fails (a full disk), the previous file is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.is_file():  # a stale one, or one planted in the folder: never written through
        tmp.unlink()
    try:
        # O_EXCL | O_NOFOLLOW: a file this call creates, never one a link at the name points to
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if why := disk_full_reason(e):
            kept = "the previous file is intact" if path.exists() else "nothing was written"
            raise DiskFull(f"{path}: {why} while writing it; {kept}: free some space (or raise the limit) and rerun",
                           getattr(e, "errno", None)) from None
        raise
    fsync_folder(path.parent)
    return path


def json_text(value, indent: int | None = 2, default=None) -> str:
    """Strict JSON (no NaN or Infinity, which other parsers refuse) with a final newline."""
    return json.dumps(value, indent=indent, allow_nan=False, default=default) + "\n"


def write_json(path, value, indent: int | None = 2, default=None) -> Path:
    return write_atomic(path, json_text(value, indent, default))


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON (the kit writes only finite numbers)")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):  # 1e999: valid JSON syntax, but Python reads it as infinity
        raise ValueError(f"{number[:40]} is out of a float's range (the kit writes only finite numbers)")
    return value


def loads(text: str | bytes):
    """Strict JSON back, the kit's one JSON reader: NaN, Infinity, 1e999 and nesting too deep are a ValueError."""
    try:
        return json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply to be a file the kit wrote") from None


def finite_number(value) -> bool:
    """A number read from a file that the kit can compute with: an int or float, not a bool, within a float's
    range and not NaN (compared, not math.isfinite'd: a 401-digit integer has no float)."""
    bounded = isinstance(value, (int, float)) and not isinstance(value, bool)
    return bounded and -sys.float_info.max <= value <= sys.float_info.max


def save_durably(file: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None):
    """safetensors' save_file, then the file fsynced: durable before its folder is renamed into place."""
    save_file(tensors, file, metadata=metadata)
    with open(file, "rb") as f:
        os.fsync(f.fileno())


def fsync_folder(folder: Path):
    """Make a folder's entries (new files, renames) durable, not just the files' contents."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Checksums: every checkpoint the kit writes carries the sha256 of each of its files; every load checks them

CHECKSUMS = "checksums.json"  # in every checkpoint: sha256 of each of its files, written at save time


def sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder: Path, known: dict[str, str] | None = None):
    """folder/checksums.json: the sha256 of each file in `folder` (those in `known` are not read again)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS
                   and not p.name.endswith(".tmp"))  # write_atomic's, left by a kill
    write_json(folder / CHECKSUMS, {p.name: (known or {}).get(p.name) or sha256(p) for p in files}, indent=1)


def damage(ckpt: Path, part: tuple[int, int] = (0, 1)) -> str:
    """Why a checkpoint cannot be trusted ("" if it can): a file missing, differing from its checksum, or not
    listed (a checkpoint from before checksums is taken as it is). part = (i, n): hash only every n-th file from
    the i-th (ranks share the reading of a large one)."""
    try:
        sums = loads((ckpt / CHECKSUMS).read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return f"{CHECKSUMS} is unreadable"
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        return f"{CHECKSUMS} is not a map of file -> sha256"
    # A checkpoint is what its checksums list: a file added later (an index a loader would prefer) is refused.
    # Sub-folders are checkpoints of their own; write_atomic's temporary files left by a kill are never read.
    extra = sorted(p.name for p in ckpt.iterdir() if p.name not in sums and p.name != CHECKSUMS
                   and not p.is_dir() and not (p.name.startswith(".") and p.name.endswith(".tmp")))
    if extra:
        return f"{extra[0]} is not one of its files (not in {CHECKSUMS}): move it out of the folder"
    for i, (name, digest) in enumerate(sorted(sums.items())):
        if not (ckpt / name).is_file():
            return f"{name} is missing"
        if i % part[1] == part[0] and sha256(ckpt / name) != digest:
            return f"{name} does not match its checksum"
    return ""


def check_checksums(path: Path):
    """A checkpoint folder whose files differ from the checksums written with them is refused."""
    if why := damage(path):
        raise CheckpointError(f"{path}: damaged ({why}); the folder is not as the kit wrote it: restore it (or move "
                              "out what was added) or retrain that checkpoint")


# Reading and writing checkpoint folders

def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory; pass a folder holding config.json and *.safetensors")
    config_file = path / "config.json"
    if not config_file.is_file() and path.name == "latest" and (path / "trainer_state.json").is_file():
        raise CheckpointError(f"{path}: latest/ is a run's resume point (sharded weights and optimizer state), not a "
                              "checkpoint to load; evaluate phase-N/ or step-N/ beside it")
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing; a HF checkpoint directory needs its config.json")
    try:
        config = loads(config_file.read_text())
    except ValueError as e:  # not JSON, or not even UTF-8 text
        raise CheckpointError(f"{config_file}: not valid JSON ({e}); re-download or re-export the checkpoint") from None
    if not isinstance(config, dict):  # every reader does config.get(...)
        raise CheckpointError(f"{config_file}: a JSON {type(config).__name__}, not an object of config fields; "
                              "re-download or re-export the checkpoint")
    return config


def tensor_files(path: Path) -> dict[str, Path]:
    """Map tensor name -> safetensors file, from model.safetensors.index.json or a single file."""
    index, single = path / "model.safetensors.index.json", path / "model.safetensors"
    if index.is_file():
        try:
            files = {str(name): str(file) for name, file in loads(index.read_text())["weight_map"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a safetensors index (no weight_map of tensor -> file); "
                                  "re-download or re-export the checkpoint") from None
        if single.is_file():  # which one holds the weights? (an index added beside a kit checkpoint)
            raise CheckpointError(f"{path}: holds both model.safetensors and model.safetensors.index.json; a "
                                  "checkpoint is one or the other: move the one you did not put there away")
        outside = next((f for f in files.values() if Path(f).name != f or f.startswith(".")), None)
        if outside is not None:  # a file of the folder is data, never a path to follow elsewhere
            raise CheckpointError(f"{index}: names {printable(outside, 80)!r}, not a file of {path}; re-download or "
                                  "re-export the checkpoint")
        return {name: path / file for name, file in files.items()}
    if not single.is_file():
        raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json; "
                              "the kit reads safetensors checkpoints only (no pickle)")
    with open_safetensors(single) as f:
        return {name: single for name in f.keys()}


FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def open_safetensors(file: Path):
    """safe_open, with a file that is not safetensors (a renamed pickle, a truncated download) as one line."""
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e}); re-download or re-export it "
                              "(the kit never reads pickle)") from None


@torch.no_grad()
def load_tensors(module: nn.Module, path: Path, dtype, device, name_in_file: Callable[[str], str | None],
                 checksums_checked: bool = False):
    """Fill a meta-device (or FSDP2-sharded) module from safetensors, one tensor at a time, a sharded parameter
    reading only its own rows; the checksums are checked first unless the caller just did."""
    if not checksums_checked:
        check_checksums(path)
    files = tensor_files(path)
    wanted = {name_in_file(name) for name, _ in module.named_parameters()} - {None}
    # A tied teacher's file may still carry lm_head.weight; any other extra tensor would load a truncated model.
    if extra := sorted(set(files) - wanted - {"lm_head.weight"}):
        raise CheckpointError(f"{path}: holds {len(extra)} tensor(s) that its config.json does not describe "
                              f"(first: {extra[0]!r}); the checkpoint and its config.json disagree")
    module.to(dtype)  # on the meta device this allocates nothing
    if any(p.is_meta for p in module.parameters()):
        module.to_empty(device=device)
    for name, param in module.named_parameters():
        key = name_in_file(name)
        if key is None:  # not stored: keeps its value
            continue
        if key not in files:
            raise CheckpointError(f"{path}: tensor {key!r} is missing; the checkpoint does not match its config.json")
        file = files[key]
        if not file.is_file():
            raise CheckpointError(f"{file}: missing, but model.safetensors.index.json lists it for {key!r}")
        with open_safetensors(file) as f:
            if key not in f.keys():
                raise CheckpointError(f"{file}: tensor {key!r} is missing; the index and the file disagree")
            stored = f.get_slice(key)
            stored_shape = tuple(stored.get_shape())
            if stored_shape != tuple(param.shape):
                raise CheckpointError(f"{file}: tensor {key!r} has shape {stored_shape}, config.json implies "
                                      f"{tuple(param.shape)}; the checkpoint and its config.json disagree")
            if stored.get_dtype() not in FLOAT_DTYPES:
                raise CheckpointError(f"{file}: tensor {key!r} is {stored.get_dtype()}, not a floating-point type; "
                                      "the checkpoint is not a model's weights")
            if hasattr(param, "device_mesh"):  # a Shard(0) DTensor: only the rows this rank holds are read
                _, offset, mine = local_rows(param)
                local = stored[offset:offset + mine.shape[0]] if mine.shape[0] else torch.empty(mine.shape)
            else:
                local = stored[:]
        if not torch.isfinite(local).all():
            raise CheckpointError(f"{file}: tensor {key!r} holds NaN or infinite values; the checkpoint is damaged "
                                  "(a diverged run or a corrupt file)")
        (param.to_local() if hasattr(param, "to_local") else param).copy_(local.to(dtype))


def write_checkpoint(path, config: dict, state: dict, extra_files: dict[str, str] | None = None):
    """Atomic: a temporary sibling folder (with `extra_files`: name -> text), then moved into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_durably(tmp / "model.safetensors", {k: v.detach().contiguous().cpu() for k, v in state.items()}, {"format": "pt"})
    write_json(tmp / "config.json", config)
    for name, text in (extra_files or {}).items():
        write_atomic(tmp / name, text)
    replace_folder(tmp, path)


def replace_folder(new: Path, path: Path, midway: Callable[[], None] = lambda: None):
    """Move a finished folder to `path`; an existing one there is removed only after the move (a `.old` left by
    a killed swap goes first). `midway` runs between the two moves (the kill tests)."""
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    midway()
    os.replace(new, path)
    fsync_folder(path.parent)
    shutil.rmtree(old, ignore_errors=True)


# Sharded state: each writer (a rank) saves its own rows of every tensor; any number of readers later read the
# rows they need, from an index (JSON) of each tensor's shape and which rows each writer's file holds.

SHARDED_INDEX = "index.json"


def local_rows(t: torch.Tensor) -> tuple[list[int], int, torch.Tensor]:
    """(global shape, first global row, this rank's rows) of a tensor (a DTensor sharded on dim 0, or plain)."""
    if not hasattr(t, "device_mesh"):
        return list(t.shape), 0, t
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return list(t.shape), offset[0] if t.dim() else 0, t.to_local()


def shard_file(kind: str, writer: int, writers: int) -> str:
    return f"{kind}.rank{writer}-of-{writers}.safetensors"


def stage_rows(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """This rank's rows of each tensor copied to host memory (even a CPU tensor's: training goes on updating the
    original while a background write reads the copy), and their entries in the index."""
    rows, entries = {}, {}
    for key, t in tensors.items():
        shape, offset, local = local_rows(t.detach())
        # a copy of its own: tied weights (a tied teacher's head) share storage, which safetensors refuses
        rows[key] = local.to("cpu", copy=True).contiguous()
        entries[key] = {"shape": shape, "offset": offset, "rows": local.shape[0] if local.dim() else None}
    return rows, entries


def write_rows(folder: Path, kind: str, staged: tuple[dict, dict], writer: int, writers: int) -> dict:
    """folder/<kind>.rank<w>-of-<n>.safetensors with this writer's rows of each tensor, as stage_rows copied them
    (safe on the writer thread, which touches no live tensor); its entry in the index."""
    name, (rows, entries) = shard_file(kind, writer, writers), staged
    save_durably(folder / name, rows)
    return {"file": name, "sha256": sha256(folder / name), "tensors": entries}


# A kept checkpoint written by several ranks: a standard HF sharded checkpoint, which every loader reads as one.
HF_INDEX = "model.safetensors.index.json"


def hf_shard_file(writer: int, writers: int) -> str:
    return f"model-{writer + 1:05d}-of-{writers:05d}.safetensors"


def tensor_writers(sizes: dict[str, int], writers: int) -> dict[str, int]:
    """Which writer writes each whole tensor (name -> bytes): largest first, each to the writer with the fewest
    bytes so far (the lowest on a tie); every rank computes the same."""
    load, owner = [0] * writers, {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        w = load.index(min(load))
        owner[name], load[w] = w, load[w] + sizes[name]
    return owner


def write_weights(folder: Path, file: str, tensors: dict[str, torch.Tensor]) -> dict:
    """folder/file: whole `tensors`, made durable; its entry in the index and in the checksums."""
    save_durably(folder / file, {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, {"format": "pt"})
    return {"file": file, "sha256": sha256(folder / file), "bytes": sum(v.nbytes for v in tensors.values()),
            "tensors": list(tensors)}


def hf_index(parts: list[dict]) -> dict:
    """model.safetensors.index.json (transformers' format) from the writers' entries (write_weights)."""
    return {"metadata": {"total_size": sum(p["bytes"] for p in parts)},
            "weight_map": {name: p["file"] for p in parts for name in p["tensors"]}}


def merge_index(parts: list[dict]) -> dict:
    """The index of a sharded folder from its writers' entries (write_rows), in writer order."""
    tensors: dict = {}
    for part in parts:
        for key, entry in part["tensors"].items():
            tensors.setdefault(key, {"shape": entry["shape"], "shards": []})["shards"].append(
                {"file": part["file"], "offset": entry["offset"], "rows": entry["rows"]})
    return {"format": 1, "files": {p["file"]: p["sha256"] for p in parts}, "tensors": tensors}


def read_rows(folder: Path, index: dict, key: str, target: torch.Tensor) -> torch.Tensor:
    """The rows of tensor `key` that `target` covers, from whichever writers' files hold them."""
    entry = index["tensors"].get(key)
    if entry is None:
        raise CheckpointError(f"{folder / SHARDED_INDEX}: has no tensor {key!r}; the checkpoint was written for "
                              "another model: move it away and rerun to resume from the last phase checkpoint")
    shape, offset, local = local_rows(target)
    if entry["shape"] != shape:
        raise CheckpointError(f"{folder / SHARDED_INDEX}: tensor {key!r} has shape {entry['shape']}, this run's is "
                              f"{shape}; move the checkpoint away and rerun to resume from the last phase checkpoint")
    if local.dim() == 0:  # a scalar (AdamW's step): the same in every writer's file
        with open_safetensors(folder / entry["shards"][0]["file"]) as f:
            return f.get_tensor(key)
    pieces, want = [], range(offset, offset + local.shape[0])
    for shard in entry["shards"]:
        have = range(shard["offset"], shard["offset"] + shard["rows"])
        start, stop = max(want.start, have.start), min(want.stop, have.stop)
        if start < stop:
            with open_safetensors(folder / shard["file"]) as f:
                pieces.append(f.get_slice(key)[start - have.start:stop - have.start])
    if sum(len(p) for p in pieces) != len(want):
        raise CheckpointError(f"{folder / SHARDED_INDEX}: tensor {key!r} lacks rows {want.start}..{want.stop - 1}; "
                              "the checkpoint is damaged: move it away and rerun")
    return torch.cat(pieces) if pieces else torch.empty(local.shape, dtype=local.dtype)

