"""Data for normgrow: the on-disk token shards (prepared from a corpus by experiments/prepare_shards.py), memory-mapped,
and the deterministic, rank-aware, resumable batches a run reads from them.

Every rank memory-maps the shards prepare_shards.prepare wrote (`python repro.py data --scale toy`):

    import data
    train, val = data.Shard("data_cache/toy/train"), data.Shard("data_cache/toy/val")
    batches = data.Batcher(train, global_batch=16, seed=0, mode="replay", replay_docs=8000,
                           rank=rank, world_size=world_size, micro_batch=4)
    step = next(batches)                 # this rank's micro-batches + the global target count
    for mb in step.micro_batches:        # mb.input_ids, mb.targets, mb.mask: (b, T)
        loss = (token_loss(mb) * mb.mask).sum() / step.global_targets    # a global mean, no all-reduce
    for vb in data.eval_batches(val, batch_size=8, rank=rank, world_size=world_size): ...

Definitions the whole kit relies on:
- A document is `[eot] + tokens(text) + [eot]`, cut to max_len + 1 tokens; inputs are all but its last
  token, targets all but its first. The leading <|endoftext|> is the document-boundary token, the
  token the diagnostics call structural.
- A batch is packed: its documents laid end to end in one row (1, N), longest first, with their lengths, so
  that no position is padding (the model restarts RoPE positions and attention at each document: model.py). A
  compiled run's batches, and the diagnostics' (whose documents fill their rows), are right-padded rows
  instead, masked by length, never by token id: Qwen pads with <|endoftext|>, which is also the boundary
  token, and a document's real final target is eot. A compiled run's are padded further, to a few fixed
  widths (fixed_shape), so that its compiled layers see a few shapes.
- Bad input raises DataError, whose one-line message names the file or option, what is wrong and
  what to do.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from plumbing import checkpoint
from plumbing.errors import DataError

# Shards: a directory with tokens.u32 (every document's tokens, flat), offsets.i64 (n_docs + 1 starts)
# and manifest.json. experiments/prepare_shards.py writes the manifest last, inside a hidden temporary sibling directory
# that is renamed into place, so a directory at a shard's path with a manifest is always complete.

SHARD_FORMAT = 1
TOKENS_FILE, OFFSETS_FILE, MANIFEST_FILE = "tokens.u32", "offsets.i64", "manifest.json"


class Shard:
    """A tokenized shard, memory-mapped. verify=True also checks both files' sha256 (reads them once)."""

    def __init__(self, path: str | Path, verify: bool = True):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.offsets = _open_array(self.path / OFFSETS_FILE, np.int64, self.manifest["n_docs"] + 1)
        self.tokens = _open_array(self.path / TOKENS_FILE, np.uint32, self.manifest["n_tokens"])
        if verify:
            for name in (OFFSETS_FILE, TOKENS_FILE):
                if checkpoint.sha256(self.path / name) != self.manifest["sha256"][name]:
                    raise DataError(f"{self.path / name}: checksum differs from {MANIFEST_FILE}; the file is "
                                    f"corrupt: rebuild the shard with force=True (--force)")
        self.lengths = np.diff(self.offsets)  # tokens per document, both <|endoftext|> included
        self.eot = self.manifest["eot"]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def __repr__(self) -> str:
        return f"Shard({self.path}, documents={len(self)}, tokens={self.n_tokens})"


def read_manifest(path: Path) -> dict:
    """The manifest of the shard at `path`, checked for the fields the shard is opened with."""
    file = path / MANIFEST_FILE
    try:
        manifest = checkpoint.loads(file.read_text())
    except FileNotFoundError:
        raise DataError(f"{file}: missing, so {path} is not a finished shard; run prepare (python repro.py data)") from None
    except ValueError as error:
        raise DataError(f"{file}: not valid JSON ({error}); rebuild the shard with force=True (--force)") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{file}: a JSON {type(manifest).__name__}, not a shard manifest; rebuild the shard with "
                        "force=True (--force)")
    if manifest.get("format") != SHARD_FORMAT:
        raise DataError(f"{file}: shard format {manifest.get('format')}, this kit reads {SHARD_FORMAT}; "
                        f"rebuild the shard with force=True (--force)")
    # The fields the shard is opened with: counts that size its arrays, the <|endoftext|> id, checksums.
    # (type() is int: a JSON true is no count)
    counts = [k for k in ("n_docs", "n_tokens", "eot") if not (type(manifest.get(k)) is int and manifest[k] >= 0)]
    sums = manifest.get("sha256")
    if counts or not (isinstance(sums, dict) and all(isinstance(sums.get(f), str) for f in (TOKENS_FILE, OFFSETS_FILE))):
        field = counts[0] if counts else "sha256"
        value = repr(manifest[field]) if field in manifest else "missing"
        raise DataError(f"{file}: {field} is {value}, not what the kit writes; the manifest is damaged: rebuild the "
                        "shard with force=True (--force)")
    return manifest


def _open_array(file: Path, dtype, count: int) -> np.ndarray:
    expected = count * np.dtype(dtype).itemsize
    size = file.stat().st_size if file.exists() else None
    if size != expected:
        raise DataError(f"{file}: {'missing' if size is None else f'{size} bytes'}, the manifest says {expected}; "
                        f"the shard is truncated or corrupt: rebuild it with force=True (--force)")
    if count == 0:
        return np.zeros(0, dtype)  # np.memmap cannot map an empty file
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))


# Batches

@dataclass
class Batch:
    """Documents right-padded with eot to the longest among them, one a row (b, T); or packed, laid end to end
    in one row (1, N), their lengths in `doc_lengths`. Everything else follows `lengths`."""
    input_ids: torch.Tensor  # (b, T) long, or (1, N) packed
    targets: torch.Tensor  # like input_ids: each document's inputs shifted by one within it
    mask: torch.Tensor  # like input_ids, bool: the real targets (a final eot target included); packed: all True
    lengths: torch.Tensor  # (documents,) long: real positions per document = document tokens - 1
    doc_ids: list[int]
    n_targets: int  # mask.sum()
    doc_lengths: tuple[int, ...] | None = None  # packed: the model's layout (host ints: no device sync); else None

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.targets.to(device), self.mask.to(device),
                     self.lengths.to(device), self.doc_ids, self.n_targets, self.doc_lengths)

    def first_positions(self) -> torch.Tensor:
        """Like mask: True at each document's first position (its document-boundary token)."""
        first = torch.zeros_like(self.mask)
        if self.doc_lengths is None:
            first[:, 0] = self.mask[:, 0]
        else:
            starts = torch.tensor((0, *self.doc_lengths[:-1]), device=self.mask.device).cumsum(0)
            first[0, starts] = True
        return first


@dataclass
class StepBatch:
    """One optimizer step for this rank: its micro-batches, and counts over the whole global batch."""
    micro_batches: list[Batch]
    global_targets: int  # real targets across all ranks: divide summed losses by it for the global mean
    doc_ids: list[int]  # this rank's documents
    step: int

    @property
    def global_tokens(self) -> int:
        """The paper's non-padding token count of the step; one target per non-padding input token."""
        return self.global_targets


def make_batch(shard: Shard, doc_ids: list[int], max_inputs: int | None = None, packed: bool = False) -> Batch:
    """A Batch of the shard's documents (each cut to max_inputs inputs if given), right-padded rows or
    `packed`; with no documents a 1x1 padded batch whose mask is all False."""
    documents = [shard.document(i)[:None if max_inputs is None else max_inputs + 1] for i in doc_ids]
    if packed and documents:
        return packed_batch(documents, list(doc_ids))
    lengths = np.array([len(d) - 1 for d in documents] or [0], dtype=np.int64)
    width = max(int(lengths.max()), 1)
    input_ids = np.full((len(lengths), width), shard.eot, dtype=np.int64)
    targets = np.full((len(lengths), width), shard.eot, dtype=np.int64)
    for row, document in enumerate(documents):
        input_ids[row, :len(document) - 1] = document[:-1]
        targets[row, :len(document) - 1] = document[1:]
    mask = np.arange(width)[None, :] < lengths[:, None]
    return Batch(torch.from_numpy(input_ids), torch.from_numpy(targets), torch.from_numpy(mask),
                 torch.from_numpy(lengths), list(doc_ids), int(lengths.sum()))


def longest_first(lengths) -> list[int]:
    """The order a packed row lays documents of `lengths` in (indices into them): longest first, ties as given, so
    documents of one length lie side by side and attend in one batched call (model.Attention.document_attention;
    42% of the toy's documents fill max_len). Only the order of sums over tokens changes with it."""
    return np.argsort(-np.asarray(lengths), kind="stable").tolist()


def packed_batch(documents: list[np.ndarray], doc_ids: list[int]) -> Batch:
    """The documents' inputs and targets laid end to end in one row (1, N), longest first: no padding."""
    order = longest_first([len(d) for d in documents])
    documents, doc_ids = [documents[i] for i in order], [doc_ids[i] for i in order]
    lengths = [len(d) - 1 for d in documents]
    row = lambda parts: torch.from_numpy(np.concatenate(parts).astype(np.int64))[None]
    input_ids, targets = row([d[:-1] for d in documents]), row([d[1:] for d in documents])
    return Batch(input_ids, targets, torch.ones_like(input_ids, dtype=torch.bool), torch.tensor(lengths), doc_ids,
                 sum(lengths), tuple(lengths))


# Fixed shapes, for a compiled run (torch.compile specialises its code to every shape it is given): a batch is
# as wide as the smallest of WIDTH_BUCKETS evenly spaced widths up to the shard's max_len that holds its longest
# document, so a run's layers see a few shapes where the longest document would give each batch its own.
WIDTH_BUCKETS = 4


def bucket_width(longest: int, max_len: int) -> int:
    """The width a batch whose longest row has `longest` positions is padded to: the smallest multiple of
    ceil(max_len / WIDTH_BUCKETS) that holds it (at least one), max_len at most (toy: 32, 64, 96 or 128)."""
    step = -(-max_len // WIDTH_BUCKETS)
    return min(max(1, -(-longest // step)) * step, max(max_len, longest))


def fixed_shape(batch: Batch, shard: Shard, rows: int) -> Batch:
    """`batch` right-padded with eot to at least `rows` rows and to the bucket width of its longest row: the
    positions and rows added are padding, masked by length as all padding is. The documents, their order
    and their real targets are the batch's own."""
    rows = max(rows, len(batch.lengths))
    width = bucket_width(batch.input_ids.shape[1], shard.manifest["max_len"])
    padded = lambda t, value: F.pad(t, (0, width - t.shape[1], 0, rows - t.shape[0]), value=value)
    return Batch(padded(batch.input_ids, shard.eot), padded(batch.targets, shard.eot), padded(batch.mask, False),
                 F.pad(batch.lengths, (0, rows - len(batch.lengths))), batch.doc_ids, batch.n_targets)


class Batcher:
    """Global batches of `global_batch` documents per step, the same on every rank; this rank's share.

    replay: only documents 0..replay_docs-1 (the one-phase shard). Epoch e visits them in the
        permutation seeded by (seed, e), then the next epoch continues with a new permutation, so the
        stream wraps within the shard. A reset() at a phase boundary (paper App. B.3) therefore replays
        epoch 0's order, while continuing (the default) gives each phase a new order of the same shard.
    fresh: first the same epoch 0 as replay, so a control's first phase sees exactly the grow run's
        batches, then shard documents replay_docs, replay_docs + 1, ... in order: no document twice.
        Running past the shard's end is a DataError.
    Ranks: each takes its micro-batches of the global batch (rank_micro_batches; balanced and packed:
    token_micro_batches), each packed (or right-padded rows; with fixed_shapes, at its bucket's width:
    fixed_shape). The iterator state is the global step: resume works across a change of world_size.
    """

    def __init__(self, shard: Shard, global_batch: int, seed: int, mode: str = "replay",
                 replay_docs: int | None = None, rank: int = 0, world_size: int = 1, micro_batch: int | None = None,
                 balance: bool = False, fixed_shapes: bool = False, doc_cost: Callable[[int], float] | None = None,
                 packed: bool = True):
        replay_docs = len(shard) if replay_docs is None else replay_docs
        if mode not in ("replay", "fresh"):
            raise DataError(f"mode={mode!r}: unknown data mode; use 'replay' or 'fresh'")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")
        micro_batch = global_batch // world_size if micro_batch is None else micro_batch
        check_split(global_batch, world_size, micro_batch)
        if not global_batch <= replay_docs <= len(shard):
            raise DataError(f"replay_docs={replay_docs}: must be between global_batch={global_batch} and the shard's "
                            f"{len(shard)} documents; prepare more training documents or lower the batch")
        self.shard, self.global_batch, self.seed, self.mode = shard, global_batch, seed, mode
        self.replay_docs, self.rank, self.world_size, self.micro_batch = replay_docs, rank, world_size, micro_batch
        self.balance, self.fixed_shapes, self.doc_cost = balance, fixed_shapes, doc_cost
        self.packed = packed and not fixed_shapes
        self.step = 0
        self._permutations: dict[int, np.ndarray] = {}

    def __iter__(self):
        return self

    def __next__(self) -> StepBatch:
        doc_ids = self.global_doc_ids(self.step)
        lengths = self.shard.lengths[doc_ids] - 1  # inputs a document
        placed = self.placed(doc_ids, lengths)
        micro_batches = [make_batch(self.shard, ids, packed=self.packed) for ids in placed]
        if self.fixed_shapes:
            micro_batches = [fixed_shape(batch, self.shard, len(batch.lengths)) for batch in micro_batches]
        step, self.step = self.step, self.step + 1
        return StepBatch(micro_batches, int(lengths.sum()), doc_ids=[i for ids in placed for i in ids], step=step)

    def placed(self, doc_ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
        """This rank's micro-batches (document ids) of a step's global batch `doc_ids` of `lengths` inputs."""
        if self.balance and self.packed:
            return token_micro_batches(doc_ids, lengths, self.micro_batch * self.shard.manifest["max_len"],
                                       self.rank, self.world_size, self.doc_cost)
        return rank_micro_batches(doc_ids, lengths, self.micro_batch, self.rank, self.world_size, self.balance)

    def first_epoch_micro_batches(self) -> list[tuple[int, ...]]:
        """This rank's micro-batches (document ids) of every step that lies in the first epoch of the one-phase
        shard, which every mode reads first (a step running into the next epoch is not among them)."""
        steps = [self.global_doc_ids(step) for step in range(self.replay_docs // self.global_batch)]
        return [tuple(ids) for doc_ids in steps for ids in self.placed(doc_ids, self.shard.lengths[doc_ids] - 1)]

    def global_doc_ids(self, step: int) -> np.ndarray:
        """The documents of global step `step`, all ranks together, in rank order."""
        positions = np.arange(step * self.global_batch, (step + 1) * self.global_batch)
        if self.mode == "fresh":
            if positions[-1] >= len(self.shard):
                raise DataError(f"fresh mode: step {step} needs {positions[-1] + 1} training documents but "
                                f"{self.shard.path} holds {len(self.shard)}; prepare more (n_train_docs) or run fewer steps")
            in_first_epoch = positions < self.replay_docs
            positions[in_first_epoch] = self._permutation(0)[positions[in_first_epoch]]
            return positions
        epochs, within = np.divmod(positions, self.replay_docs)
        return np.concatenate([self._permutation(e)[within[epochs == e]] for e in np.unique(epochs)])

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            self._permutations = {e: p for e, p in self._permutations.items() if e == epoch - 1}  # a step spans <= 2
            self._permutations[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.replay_docs)
        return self._permutations[epoch]

    def reset(self) -> None:
        """Back to the first batch (the option to reset the iterator at phase boundaries)."""
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "mode": self.mode, "seed": self.seed, "global_batch": self.global_batch,
                "replay_docs": self.replay_docs}

    def load_state_dict(self, state: dict) -> None:
        # Both modes serve the same first epoch, so a fresh-data control may continue a replay run
        # that stopped within it (the long joint controls start from the joint run's first phase).
        in_shared_epoch = state.get("step", 0) * self.global_batch <= self.replay_docs
        keys = ("seed", "global_batch", "replay_docs") + (() if in_shared_epoch else ("mode",))
        for k in keys:
            if state.get(k) != getattr(self, k):
                raise DataError(f"batcher state: saved with {k}={state.get(k)!r} but this run has {getattr(self, k)!r}; "
                                f"resume with the saved data settings")
        self.step = int(state["step"])


def rank_micro_batches(doc_ids: np.ndarray, lengths: np.ndarray, micro_batch: int, rank: int, world_size: int,
                       balance: bool = False) -> list[list[int]]:
    """Rank `rank`'s micro-batches (document ids) of one step's global batch `doc_ids` (with their
    `lengths`), the same computation on every rank.

    Default: the rank's contiguous chunk, cut into micro-batches in order. balance: the ranks' j-th
    micro-batches run together (every layer's all-gather waits for the slowest rank), and a micro-batch
    is padded to its longest document, so a step costs about the sum over j of the longest document in
    any rank's j-th micro-batch. Longest first: the step's documents sorted by length (ties in the
    seeded order, so it is reproducible from the seed), cut in that order into micro-batches of
    `micro_batch`, the (j * world_size + r)-th being rank r's j-th. That sum is then the least any
    placement gives (each slot holds the longest documents left), and the micro-batches, as sets of
    documents, do not depend on world_size: one process and any number of ranks sum the gradients of the
    same micro-batches (FSDP2's tests of equality with one process hold with it)."""
    per_rank = len(doc_ids) // world_size
    if not balance:
        mine = doc_ids[rank * per_rank:(rank + 1) * per_rank].tolist()
        return [mine[i:i + micro_batch] for i in range(0, per_rank, micro_batch)]
    by_length = doc_ids[np.argsort(-np.asarray(lengths), kind="stable")].tolist()
    groups = [by_length[i:i + micro_batch] for i in range(0, len(by_length), micro_batch)]
    return groups[rank::world_size]


def token_micro_batches(doc_ids: np.ndarray, lengths: np.ndarray, budget: int, rank: int, world_size: int,
                        cost: Callable[[int], float] | None = None) -> list[list[int]]:
    """Rank `rank`'s packed micro-batches (document ids) of one step's global batch, placed by tokens, the same
    computation on every rank. A packed micro-batch costs the sum of its documents' costs, not its rows times
    the longest, so what wastes time is a rank waiting for another: the ranks' j-th micro-batches run together
    (every FSDP2 all-gather). A document's cost is `cost(its tokens)` (flops.document_cost: attention makes it
    more than linear; default: its tokens). The step gets the fewest micro-batches of at most `budget` input
    tokens (the memory a micro-batch of micro_batch documents at max_len was sized for) that is a multiple of
    world_size, so every rank has as many; its documents, costliest first (ties in the seeded order), each go to
    the micro-batch of least cost that has room (a document is never cut: it would lose its attention to its own
    start), world_size more micro-batches opened where none has; the micro-batches, costliest first, are dealt
    to the ranks in turn (rank r's j-th is the (j * world_size + r)-th), so each slot's ranks carry about equal
    cost.
    An empty one is an empty forward (every rank must join every all-gather). The micro-batches depend on
    world_size only through their count: one process and any number of ranks sum the same documents."""
    lengths = [int(n) for n in lengths]
    weight = [float(cost(n)) if cost else float(n) for n in lengths]
    bins: list[list[int]] = [[] for _ in range(world_size * max(1, -(-sum(lengths) // (world_size * budget))))]
    tokens, spent = [0] * len(bins), [0.0] * len(bins)
    for i in np.argsort(-np.asarray(weight), kind="stable"):
        open_ = [b for b in range(len(bins)) if tokens[b] + lengths[i] <= budget]
        if not open_:
            bins += [[] for _ in range(world_size)]
            tokens, spent = tokens + [0] * world_size, spent + [0.0] * world_size
            open_ = list(range(len(bins) - world_size, len(bins)))
        fit = min(open_, key=lambda b: spent[b])
        bins[fit].append(int(doc_ids[i]))
        tokens[fit], spent[fit] = tokens[fit] + lengths[i], spent[fit] + weight[i]
    order = sorted(range(len(bins)), key=lambda b: -spent[b])
    return [bins[b] for b in order][rank::world_size]


def check_split(global_batch: int, world_size: int, micro_batch: int) -> None:
    """A global batch splits evenly over the ranks (each one document at least), and a rank's share into
    micro-batches: the one check of a launch's shape, made by the launch before any work
    (training.check_before_work) and by every Batcher, by the dry run (plan.print_plan) and by the rehearsal,
    so that all of them refuse the same shapes with the same line."""
    ranks = "the ranks (torchrun's processes; --gpus x --nodes in a dry run or rehearsal)"
    if global_batch < 1 or global_batch % world_size:
        raise DataError(f"global_batch={global_batch}: must be a positive multiple of world_size={world_size}; "
                        f"change the global batch (--set run.global_batch) or {ranks}")
    if micro_batch < 1 or (global_batch // world_size) % micro_batch:
        raise DataError(f"micro_batch={micro_batch}: must divide the {global_batch // world_size} documents per rank "
                        f"(global_batch={global_batch} / world_size={world_size}); pick a divisor (--set "
                        f"run.micro_batch) or change {ranks}")


def diagnostic_batch(shard: Shard, docs: int, max_inputs: int, seed: int) -> Batch:
    """The fixed batch the diagnostics run on (paper: 2 x 2048 tokens, seed 42): the first `docs`
    documents of a seeded order that are long enough to fill max_inputs positions (shorter ones only
    if too few are), each cut to max_inputs. Every row starts with its document-boundary token."""
    order = np.random.default_rng(seed).permutation(len(shard))
    long_enough = shard.lengths[order] - 1 >= max_inputs
    chosen = np.concatenate([order[long_enough], order[~long_enough]])[:docs]
    return make_batch(shard, chosen.tolist(), max_inputs)


def eval_batches(shard: Shard, batch_size: int, rank: int = 0, world_size: int = 1,
                 fixed_shapes: bool = False, packed: bool = True) -> Iterator[Batch]:
    """Every document of `shard` exactly once across ranks, batch_size documents per rank, placed by
    eval_placement. Every rank yields the same number of batches: a rank past the end gets a 1x1 batch
    with an all-False mask. NOTE: under FSDP every rank must run every forward pass, so run the model on
    these too, sum losses over the mask and all-reduce sums and counts. Each batch is packed, or (not
    packed) right-padded rows, or with fixed_shapes, batch_size padded rows (empty ones after the last
    document) at its bucket's width (fixed_shape).
    """
    if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"eval batch_size={batch_size}, rank={rank}, world_size={world_size}: need batch_size >= 1 "
                        f"and 0 <= rank < world_size")
    for step in eval_placement(shard.lengths, batch_size, world_size):
        batch = make_batch(shard, step[rank], packed=packed and not fixed_shapes)
        yield fixed_shape(batch, shard, batch_size) if fixed_shapes else batch


def eval_placement(lengths: np.ndarray, batch_size: int, world_size: int) -> list[list[list[int]]]:
    """The evaluation's steps, each a list of every rank's documents: the documents in order cut into
    batches of batch_size, the same batches for any world size, so one process and any number of ranks
    sum the same batches (a rank's batch is one forward, its sums the same wherever it runs; only the
    order of the float64 additions differs). With several ranks the batches go out longest first, the
    step's ranks taking the next world_size of them: every FSDP2 all-gather makes a step wait for its
    slowest rank, a batch costs as its longest document (padding), and placed in order one rank's long
    document holds up the others' short ones (at one document a batch, 8 ranks and FineWeb-Edu's lengths,
    about three times the work). One process keeps the order."""
    n = len(lengths)
    batches = [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]
    if world_size > 1:  # longest first, ties in order (stable): the same placement on every rank
        batches.sort(key=lambda docs: -int(np.max(lengths[docs])))
    steps = [batches[i:i + world_size] for i in range(0, len(batches), world_size)]
    return [step + [[]] * (world_size - len(step)) for step in steps]
