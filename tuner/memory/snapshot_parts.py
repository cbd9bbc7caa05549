"""A CUDA memory snapshot read back as the estimate's parts (pure, but for ``read``): the live blocks of the snapshot
an OOM probe dumped (trials.oom_snapshot; ``torch.cuda.memory._dump_snapshot``'s pickle, the dict torch documents in
``torch.cuda.memory._snapshot``: ``segments`` -> ``blocks`` with ``size``, ``state`` and the ``frames`` of the stack
that allocated it, innermost first) summed per part of tuner.memory.breakdown by the frames that allocated them.

Each block goes to the first rule (``RULES``, an ordered table) that matches its innermost frame, else its next frame
outwards, and so on: the most specific call site decides (an AdamW state created by torch.optim under DeepSpeed's
step is an optimizer state; a forward recomputed in the backward, an activation). A block with no frames was either
allocated before the probe started recording (its memory window opens after the model is built: the parameters as
loaded, and what else setup left), or recorded on a thread that runs no Python: with ``stacks="python"`` (the probe's
recording) the blocks the autograd engine's own thread allocates on CUDA, the backward's gradients and temporaries,
carry none. The snapshot's allocation trace (``device_traces``) tells them apart: a frameless block whose address an
``alloc`` of the recording made (and nothing freed since) is the backward's (``unframed``, counted as gradients);
the others were there before. A block no rule matches is unattributed, and its innermost frames are listed.

Reading is bounded and safe (issue 33 §2, §4-§7): only a regular file of at most ``MAX_FILE_BYTES`` is read, by
an unpickler that builds only builtin containers and scalars (the snapshot is plain dicts, lists, strings and ints;
anything else is refused in one line), in a child process (tuner.memory.snapshot_child: limited memory and time,
so a pickle that crashes the C unpickler, a 1,000,000-deep tuple hashed as a dict key, takes only the child down);
at most ``MAX_BLOCKS`` blocks and ``MAX_FRAMES`` frames of each are read (the record says when it stopped), a
frame's file and function must be text and are cut (``MAX_FILE_TEXT``, ``MAX_NAME_TEXT``) before any pattern is
searched in them, a block's size must be a byte count a device can hold (``MAX_SIZE``), and a stack shared by many
blocks is attributed once.

torch.profiler's frames (torch.cuda._memory_viz._profile_to_snapshot builds the same dict from a profile, on CPU too)
carry the place in the frame's name, ``torch/optim/adam.py(139): _init_group``; they are read the same way."""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tuner.errors import TunerError
from tuner.memory.breakdown import (
    ACTIVATIONS,
    GENERATION_CACHE,
    GRADIENTS,
    OPTIMIZER,
    PARAMETERS,
    PARTS,
    ZERO_BUFFERS,
)

MAX_FILE_BYTES = 256 << 20  # trials.oom_snapshot keeps none larger
MAX_BLOCKS = 200_000  # blocks summed (about 1 s per 100,000 of 40-frame stacks); more: cut, and it says so
MAX_TRACE_ENTRIES = 1_000_000  # allocation-trace entries read (torch keeps max_entries of them per device)
MAX_FRAMES = 256  # frames of one stack read, innermost first (a CUDA stack holds tens)
MAX_FILE_TEXT = 240  # a frame's file, its last characters kept (the rules match the path's end)
MAX_NAME_TEXT = 360  # a frame's function (a profiler frame's carries its file too), its first characters kept
MAX_SIZE = 1 << 50  # a block or segment of more bytes than 1 PiB is not one a device holds
SHOWN_FRAMES = 5  # the largest unattributed call sites kept
LIVE = "active_allocated"  # a block a tensor holds (torch's Block.state)


class SnapshotError(TunerError):
    """The snapshot file cannot be read as one (missing, too large, not a torch memory snapshot)."""


@dataclass(frozen=True)
class Rule:
    """A frame that allocates a part: ``pattern`` is searched in ``path/to/file.py:function`` (slashes forward)."""

    part: str
    pattern: str
    what: str

    def matches(self, frame: str) -> bool:
        return re.search(self.pattern, frame) is not None


#: first match wins, frame by frame from the innermost outwards
RULES: tuple[Rule, ...] = (
    Rule(GENERATION_CACHE, r"transformers/cache_utils\.py:", "transformers' KV cache (DynamicCache and kin)"),
    Rule(
        ZERO_BUFFERS,
        r"deepspeed/runtime/zero/[^:]*:\w*(ipg|bucket|reduce|all_?gather|allgather|flatten_dense)",
        "DeepSpeed ZeRO's gradient buckets and reduce / all-gather buffers",
    ),
    Rule(ZERO_BUFFERS, r"torch/distributed/", "a collective's buffers (torch.distributed)"),
    Rule(OPTIMIZER, r"torch/optim/", "a torch optimizer's state and step"),
    Rule(OPTIMIZER, r"deepspeed/ops/(adam|lamb|adagrad|lion)/", "DeepSpeed's fused / CPU optimizers"),
    Rule(
        OPTIMIZER,
        r"deepspeed/runtime/zero/[^:]*:\w*(fp32|single_partition|optimizer_state|\bstep\b|_optimizer_step)",
        "DeepSpeed ZeRO's fp32 partitions and optimizer step",
    ),
    Rule(
        PARAMETERS,
        r"(transformers/modeling_utils\.py:|torch/nn/modules/module\.py:(_apply|to|cuda|convert)$"
        r"|torch/nn/modules/[^:]*:(__init__|reset_parameters)$|deepspeed/runtime/engine\.py:(__init__|_configure))",
        "model construction, loading, .to(device) and the engine's setup",
    ),
    Rule(
        ACTIVATIONS,
        r"(torch/nn/modules/|torch/nn/functional\.py:|transformers/models/|torch/utils/checkpoint\.py:)",
        "the model's forward (a recomputed forward in the backward too)",
    ),
    Rule(
        GRADIENTS,
        r"(torch/autograd/|torch/_tensor\.py:backward$|deepspeed/runtime/engine\.py:backward)",
        "the backward (parameter gradients, and the backward's own temporaries)",
    ),
    Rule(GENERATION_CACHE, r"trials/decode\.py:", "the decode loop's own tensors (token ids, masks, the cache kept)"),
)


@dataclass(frozen=True)
class CallSite:
    """Live bytes allocated under one innermost frame (``file.py:line:function``), in ``blocks`` blocks."""

    frame: str
    nbytes: int
    blocks: int


@dataclass(frozen=True)
class SnapshotParts:
    """A snapshot's live bytes per estimate part (``parts``, in breakdown.PARTS order), those allocated before the
    recording started (no frames, and no alloc in the recording's trace), the unattributed rest and its largest call
    sites; ``reserved`` is the segments' total (live + cached). ``blocks`` were summed; ``cut`` when the snapshot had
    more (MAX_BLOCKS). ``unframed``: of the gradients, the bytes recorded with no Python frames (the autograd
    engine's thread), attributed by the trace, not by frames."""

    path: str
    parts: tuple[tuple[str, int], ...]
    before_recording: int
    unattributed: int
    unattributed_sites: tuple[CallSite, ...]
    live: int
    reserved: int
    blocks: int
    cut: bool = False
    unframed: int = 0

    def part(self, name: str) -> int:
        return dict(self.parts).get(name, 0)


@dataclass(frozen=True)
class SnapshotRead:
    """A snapshot file and what reading it gave: its parts, else why it could not be read (one line)."""

    path: str
    parts: SnapshotParts | None = None
    error: str | None = None


class _PlainUnpickler(pickle.Unpickler):
    """Builds builtin containers and scalars only: a pickle that names any class or function is refused."""

    def find_class(self, module: str, name: str) -> type:
        named = f"{module}.{name}"  # cut (a 50 MB name is not a 50 MB line) and escaped (no raw ESC in --json)
        named = ascii(named[:80])[1:-1] + ("..." if len(named) > 80 else "")
        raise SnapshotError(f"refused: it names {named}, and a torch memory snapshot holds only plain data")


def loads(data: bytes) -> object:
    """The plain data pickled in ``data`` (no class or function is ever resolved)."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except Exception as exc:  # a truncated or corrupt pickle: any of pickle's many error types
        raise SnapshotError(f"not a pickle ({type(exc).__name__}: {str(exc)[:80]})") from None


#: torch.profiler's frames (the snapshot torch.cuda._memory_viz._profile_to_snapshot builds from a CPU or CUDA
#: profile) have filename "none" and the place in the name: ``torch/optim/adam.py(139): _init_group``
_PROFILER_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")


def _text(frame: Mapping[str, object], key: str) -> str:
    """A frame's ``filename`` or ``name``, cut: text only (a tuple a million deep is neither hashed nor printed)."""
    value = frame.get(key, "")
    if not isinstance(value, str):
        raise SnapshotError(f"not a torch memory snapshot (a frame's {key} is {type(value).__name__}, not text)")
    return value[-MAX_FILE_TEXT:] if key == "filename" else value[:MAX_NAME_TEXT]


def _line(frame: Mapping[str, object]) -> object:
    line = frame.get("line", "?")
    return line if isinstance(line, int) and 0 <= line < 1 << 31 else "?"


def _where(frame: Mapping[str, object]) -> tuple[str, object, str]:
    """A frame's (file, line, function), slashes forward, read from the profiler's name where it carries them."""
    filename, line, name = _text(frame, "filename"), _line(frame), _text(frame, "name")
    found = _PROFILER_NAME.match(name) if filename in ("none", "") else None
    if found is not None:
        filename, line, name = found["file"], found["line"], found["name"]
    return filename.replace("\\", "/"), line, name


def frame_key(frame: Mapping[str, object]) -> str:
    """``path/to/file.py:function``: what the rules search."""
    filename, _, name = _where(frame)
    return f"{filename}:{name}"


def frame_text(frame: Mapping[str, object]) -> str:
    """``dir/file.py:line:function`` (the file's last two path parts), as pytorch.org/memory_viz shows a frame."""
    filename, line, name = _where(frame)
    return f"{'/'.join(filename.split('/')[-2:])}:{line}:{name}"


def rule_of(
    frames: Sequence[Mapping[str, object]],
    rules: Sequence[Rule] = RULES,
    seen: dict[tuple[str, str], Rule | None] | None = None,
) -> Rule | None:
    """The first rule that matches, frame by frame from the innermost; None when none matches. ``seen`` memoizes
    each frame's rule (a snapshot repeats the same frames in thousands of stacks)."""
    seen = {} if seen is None else seen
    for frame in frames:
        raw = (_text(frame, "filename"), _text(frame, "name"))
        if raw not in seen:
            key = frame_key(frame)
            seen[raw] = next((r for r in rules if r.matches(key)), None)
        found = seen[raw]
        if found is not None:
            return found
    return None


def part_of(frames: Sequence[Mapping[str, object]], rules: Sequence[Rule] = RULES) -> str | None:
    """The part the frames' rule gives (:func:`rule_of`); None when no rule matches."""
    rule = rule_of(frames, rules)
    return None if rule is None else rule.part


def _segments(snapshot: object) -> list[Mapping[str, object]]:
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise SnapshotError("not a torch memory snapshot (no 'segments' list)")
    return [s for s in snapshot["segments"][:MAX_BLOCKS] if isinstance(s, dict)]  # a segment holds a block or more


def _blocks(segments: list[Mapping[str, object]]) -> Iterable[Mapping[str, object]]:
    for seg in segments:
        blocks = seg.get("blocks")
        if isinstance(blocks, list):
            yield from (b for b in blocks if isinstance(b, dict))


def _bytes(value: object, what: str) -> int | None:
    """A block's or segment's byte count (None: not an int); SnapshotError past what a device holds."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not 0 <= value <= MAX_SIZE:
        said = f"{value:,}" if abs(value) < 10**30 else f"{'-' if value < 0 else ''}about 2^{value.bit_length()}"
        raise SnapshotError(f"not a torch memory snapshot (a {what} of {said} bytes)")
    return value


def recorded_live(snapshot: object, max_entries: int = MAX_TRACE_ENTRIES) -> set[int]:
    """The addresses an ``alloc`` of the recording's trace (``device_traces``, oldest first) made and nothing freed
    since: the blocks allocated while recording, frames or not. Empty where the snapshot has no trace."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    live: set[int] = set()
    entries = (e for trace in (traces if isinstance(traces, list) else []) if isinstance(trace, list) for e in trace)
    for n, entry in enumerate(entries):
        if n >= max_entries:
            break
        addr = entry.get("addr") if isinstance(entry, dict) else None
        if not isinstance(addr, int) or isinstance(addr, bool):
            continue
        action = entry.get("action")
        if action == "alloc":
            live.add(addr)
        elif action in ("free_requested", "free_completed"):
            live.discard(addr)
    return live


#: a stack read once: None (no frames: allocated before the recording), else its rule and innermost frame's text
Stack = tuple[Rule | None, str] | None


def _stack(held: object, seen: dict[tuple[str, str], Rule | None]) -> Stack:
    frames = [f for f in held[:MAX_FRAMES] if isinstance(f, dict)] if isinstance(held, list) else []
    if not frames:
        return None
    return rule_of(frames, RULES, seen), frame_text(frames[0])


def attribute(snapshot: object, path: str = "", max_blocks: int = MAX_BLOCKS) -> SnapshotParts:
    """The snapshot's live bytes per estimate part (see the module's rules)."""
    by_part = dict.fromkeys(PARTS, 0)
    before = unattributed = live = unframed = 0
    recorded = recorded_live(snapshot)
    sites: dict[str, list[int]] = {}
    seen_frames: dict[tuple[str, str], Rule | None] = {}
    stacks: dict[int, Stack] = {}  # by the frames list's identity: one list shared by many blocks is read once
    segments = _segments(snapshot)
    seen = 0
    cut = False
    for block in _blocks(segments):
        if seen >= max_blocks:
            cut = True
            break
        seen += 1
        size = _bytes(block.get("size"), "block")
        if block.get("state") != LIVE or size is None:
            continue
        live += size
        held = block.get("frames")
        if id(held) not in stacks:
            stacks[id(held)] = _stack(held, seen_frames)
        found = stacks[id(held)]
        if found is None and block.get("address") in recorded:
            unframed += size  # recorded, on a thread without Python: the autograd engine's (the backward)
        elif found is None:
            before += size
        elif found[0] is None:
            unattributed += size
            site = sites.setdefault(found[1], [0, 0])
            site[0] += size
            site[1] += 1
        else:
            by_part[found[0].part] += size
    reserved = sum(n for s in segments if (n := _bytes(s.get("total_size"), "segment")) is not None)
    largest = sorted(sites.items(), key=lambda kv: -kv[1][0])[:SHOWN_FRAMES]
    by_part[GRADIENTS] += unframed
    return SnapshotParts(
        path=path,
        parts=tuple(by_part.items()),
        before_recording=before,
        unattributed=unattributed,
        unattributed_sites=tuple(CallSite(f, n, c) for f, (n, c) in largest),
        live=live,
        reserved=reserved,
        blocks=seen,
        cut=cut,
        unframed=unframed,
    )


def parse_file(path: str, max_bytes: int = MAX_FILE_BYTES) -> SnapshotParts:
    """The snapshot at ``path`` attributed, in this process (tuner.memory.snapshot_child.read runs it in a child);
    SnapshotError or OSError when it cannot be."""
    size = regular_size(path)
    if size > max_bytes:
        raise SnapshotError(f"{size / (1 << 20):,.0f} MiB, over the {max_bytes >> 20} MiB read at most")
    with open(path, "rb") as fh:
        data = loads(fh.read(max_bytes + 1))
    try:
        return attribute(data, path)
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:  # plain data, but not torch's shape
        raise SnapshotError(f"not a torch memory snapshot ({type(exc).__name__}: {str(exc)[:80]})") from None


def regular_size(path: str) -> int:
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):  # a FIFO would hang the read, a device has size 0 and no end
        raise SnapshotError("not a regular file (tuner reads no devices or pipes)")
    return info.st_size
