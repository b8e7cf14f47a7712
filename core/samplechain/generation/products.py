"""The layouts of a pass's linear products on a CPU: the model's own x W^T, W x^T (COLUMNS) and oneDNN's product on
a packed copy of the weight (PACKED), which of them runs a pass's 1-128 rows of a linear layer and any rows of the
vocabulary head (`FewRowProducts`), and which is the fastest on this machine for a row count (`layouts_of`, kept on
disk for later processes: `KeptLayouts`): the transformers runner's checks of drafted tokens run in them. Its
batch-invariant passes run every row of every linear layer (transformers' Conv1D too) packed, where oneDNN sums a
row's products in one order whatever the other rows."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import GenerationWarning
from ..models import cache_dir, write_json

# MKL's float32 product input @ weight^T over few rows reads the weight at a third to a half of the speed that
# weight @ input^T reaches on an AMD CPU, and one row (a matrix-vector product in either layout) at a third to a half
# of the speed of the same product over two columns (W [x 0]^T), most of all over the vocabulary head (the model's
# output embeddings); on an Intel CPU input @ weight^T was the faster over 1-5 rows, on some days of one host; and
# over 4-11 rows of the vocabulary head, and over 6-88 rows of the other layers on an AMD CPU, read from memory as a
# pass reads them, oneDNN's product on a copy of the weight packed for it ran in half the time of either
# (docs/performance.md, "Few-row products"): which layout a pass runs is therefore timed per row count (layouts_of)
FEW_ROWS = range(1, 6)  # the rows whose layers W x^T runs where the layouts are fixed (few_row_products True)
# the rows of a pass whose layers may run in another layout than the model's own (timed): a check's rows times its
# width at B <= 8 and more; past them a pass (a prefill, a long scoring) runs MKL's product at its speed, and a
# timing would multiply the whole model by that many rows nine times
LAYER_ROWS = range(1, 129)
# the layers' packed copies take as much memory as their weights: made only where that is at most this share of the
# memory the machine has free when the layouts are first timed
_PACKED_SHARE = 0.25
COLUMNS, PACKED = "columns", "packed"  # the layouts besides the model's own (None): W x^T, oneDNN's packed weight


def _packs_weights() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):  # a torch built without oneDNN, or without that operator
        return False


_PACKED = _packs_weights()


_few_rows = threading.local()  # .passes: (layers, head, every row) of this thread's passes inside few-row products
# id(model): (passes inside FewRowProducts, of any thread; the layers whose forward they swapped)
_patched: dict[int, tuple[int, list[torch.nn.Module]]] = {}
# model: its linear layers, each with the forward a pass inside FewRowProducts gives it (found once a model)
_layers: weakref.WeakKeyDictionary[torch.nn.Module, list[tuple[torch.nn.Module, Any]]] = weakref.WeakKeyDictionary()
_patching = threading.Lock()
# id(weight): (its storage and version when packed, the copy oneDNN multiplies, a reference that drops the entry with
# the weight): a weight changed in place (a training step, load_state_dict) is packed again at its next product
_packs: dict[int, tuple[tuple[int, int], torch.Tensor, weakref.ref[torch.Tensor]]] = {}


def _few_row_linear(module: torch.nn.Linear, head: bool, x: torch.Tensor) -> torch.Tensor:
    """`module`'s forward while a model is inside FewRowProducts: float32 rows of this thread in the layout the
    innermost pass of this thread gives its part (the vocabulary head, `head`, or the other layers, of 1-128 rows or,
    in a pass of every row, of any number)."""
    weight = module.weight
    rows = x.numel() // max(x.shape[-1], 1)
    passes = getattr(_few_rows, "passes", None)
    if passes and x.dtype == weight.dtype == torch.float32:
        layers, head_layout, every_row = passes[-1]
        layout = head_layout if head else layers if every_row or rows in LAYER_ROWS else None
        if layout is not None:
            out = product(weight, x.reshape(rows, x.shape[-1]), layout).reshape(*x.shape[:-1], weight.shape[0])
            return out if module.bias is None else out + module.bias
    return F.linear(x, weight, module.bias)


def _few_row_conv1d(module: Any, x: torch.Tensor) -> torch.Tensor:
    """The forward of transformers' Conv1D (x W + b, its weight stored as inputs x outputs: GPT-2's layers) while a
    model is inside FewRowProducts: its own, but in a pass of every row, whose layers' layout its float32 rows take."""
    weight: torch.Tensor = module.weight
    passes = getattr(_few_rows, "passes", None)
    if passes and passes[-1][2] and passes[-1][0] is not None and x.dtype == weight.dtype == torch.float32:
        rows = x.numel() // max(x.shape[-1], 1)
        out = product(weight, x.reshape(rows, x.shape[-1]), passes[-1][0], transposed=True)
        return (out + module.bias).reshape(*x.shape[:-1], weight.shape[1])
    return type(module).forward(module, x)


def product(weight: torch.Tensor, x: torch.Tensor, layout: str | None, transposed: bool = False) -> torch.Tensor:
    """x W^T of the rows x in `layout` (x W where the weight is stored `transposed`, inputs x outputs): the model's
    own (None); COLUMNS, as (W x^T)^T (one row as two columns with a zero one: MKL multiplies one column as a
    matrix-vector product, which streams the weight slowly); PACKED, by oneDNN on a copy of W packed for it (one row
    as two alike rows: oneDNN sums a row alone in another order than among others, and among any number of others in
    one order)."""
    if layout is None:
        return x @ weight if transposed else F.linear(x, weight)
    rows = x.shape[0]
    if layout == PACKED:
        pair = torch.cat([x, x]) if rows == 1 else x
        return torch.ops.mkldnn._linear_pointwise(pair, _packed(weight, transposed), None, "none", [None], "")[:rows]
    columns = torch.cat([x, torch.zeros_like(x)]) if rows == 1 else x
    return ((weight.T if transposed else weight) @ columns.T)[:, :rows].T


def _packed(weight: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """`weight` (or its transpose) packed for oneDNN's product, packed once while the weight stays as it is."""
    try:
        state = (weight.data_ptr(), weight._version)
    except RuntimeError:  # an inference tensor keeps no version (nor can it change in place)
        state = (weight.data_ptr(), 0)
    found = _packs.get(id(weight))
    if found is None or found[0] != state:
        gone = functools.partial(lambda key, _: _packs.pop(key, None), id(weight))
        matrix = weight.detach().T.contiguous() if transposed else weight.detach()
        found = state, torch.ops.mkldnn._reorder_linear_weight(matrix, 16), weakref.ref(weight, gone)
        _packs[id(weight)] = found
    return found[1]


class FewRowProducts:
    """While inside, `model`'s linear layers (`torch.nn.Linear` itself, where nothing else has replaced its forward)
    compute 1-128 rows of this thread's passes in the layout `layers`, and any rows of its vocabulary head in `head`
    (None: the model's own; by default (W x^T)^T): the same product, rounded as any other summation order. With
    `every_row`, the layers' products of any number of rows, and those of transformers' Conv1D layers, run in
    `layers` too.

    The layers' forward is swapped for the pass rather than every torch call intercepted (a TorchFunctionMode): a
    model makes some 600 torch calls a pass, and sending each through Python cost a check 10-15% of its time. Other
    threads' passes on the same model meanwhile keep the model's own products (the thread-local count), and the last
    pass out of a model, of any thread, gives its layers their forward back."""

    def __init__(
        self, model: torch.nn.Module, layers: str | None = COLUMNS, head: str | None = COLUMNS, every_row: bool = False
    ) -> None:
        self.model = model
        # the layouts of the layers' products (of 1-128 rows, or of any number) and of the head's
        self.parts = (layers, head, every_row)

    def __enter__(self) -> FewRowProducts:
        with _patching:
            inside, layers = _patched.get(id(self.model), (0, []))
            if not inside:
                swaps = [(layer, fn) for layer, fn in _linear_layers(self.model) if "forward" not in vars(layer)]
                for layer, fn in swaps:
                    vars(layer)["forward"] = fn
                layers = [layer for layer, _ in swaps]
            _patched[id(self.model)] = (inside + 1, layers)
        _few_rows.passes = [*getattr(_few_rows, "passes", []), self.parts]
        return self

    def __exit__(self, *exc: object) -> None:
        _few_rows.passes = _few_rows.passes[:-1]
        with _patching:
            inside, layers = _patched.pop(id(self.model))
            if inside > 1:
                _patched[id(self.model)] = (inside - 1, layers)
                return
            for layer in layers:
                del vars(layer)["forward"]


def head_of(model: torch.nn.Module) -> Any:
    """The model's vocabulary head (its output embeddings, as transformers names them), or None."""
    output = getattr(model, "get_output_embeddings", None)
    return output() if callable(output) else None


def _linear_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """`model`'s `torch.nn.Linear` and transformers' Conv1D layers with the forward a check gives each, found at its
    first check: walking the model's modules at every check would add Python work to each one."""
    found = _layers.get(model)
    if found is None:
        head = head_of(model)
        conv1d = _conv1d()
        found = []
        for m in model.modules():
            if type(m) is torch.nn.Linear:
                found.append((m, functools.partial(_few_row_linear, m, m is head)))
            elif conv1d is not None and type(m) is conv1d:
                found.append((m, functools.partial(_few_row_conv1d, m)))
        _layers[model] = found
    return found


def _conv1d() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return None
    return Conv1D


class _Layouts:
    """Which layout runs a model's linear products of n rows fastest on this machine: the model's own x W^T (None),
    W x^T (COLUMNS) or oneDNN's product on a packed copy of the weight (PACKED; for the other layers than the head
    only where their copies fit in a quarter of the memory free when the model's layouts are first asked for), for the
    head and for the other layers apart. Timed once per row count, before the first pass that needs it, over every
    such weight of the model in each layout in turn, each round after reading the other part's weights, as a pass
    streams them from memory (the quicker of `ROUNDS` rounds after one that warms up the layouts no earlier timing
    ran, and oneDNN's packed one, which prepares its kernel per shape, every time); a row count of 1-4, which a pass
    runs in both parts, times them together, the layers' products and the head's in alternation, so that each part's
    products are what reads the other's weights out of the caches. Row counts past 4 share the timing of the
    next of 6, 8, 12, 16, 24, ... (`timed_rows`): a batch's checks take many row counts (rows x draft width), and each
    timing reads the model's weights six to nine times. The choice then holds for the model in this process, so
    passes of one shape always round alike (the same tokens scored twice give the same logprobs), and is kept on disk
    for the next process on this machine (`KeptLayouts`). A part's packed copies are kept only while a row count runs
    in them."""

    ROUNDS = 2
    clock = staticmethod(time.perf_counter)

    def __init__(self, model: torch.nn.Module) -> None:
        head = head_of(model)
        float32 = [
            m for m, _ in _linear_layers(model) if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
        ]
        self.weights = {
            True: [m.weight for m in float32 if m is head],
            False: [m.weight for m in float32 if m is not head],
        }
        # the layouts each part is timed in: the head's and the layers' (PACKED for the layers only where their
        # copies fit in the memory free now)
        self.parts = {part: _layouts_of_part(part, weights) for part, weights in self.weights.items()}
        self.chosen: dict[tuple[bool, int], str | None] = {}  # (head, timed rows) -> the fastest layout
        # (head, layout) that a timing has run: MKL's products need no warm-up for a new row count after their
        # first; oneDNN's packed product does (it prepares its kernel per shape)
        self.warm: set[tuple[bool, str | None]] = set()
        self._lock = threading.Lock()
        path = kept_layouts_file()
        self.kept = None if path is None else KeptLayouts(path, self.weights, self.parts)
        if self.kept is not None:
            self.chosen.update(self.kept.load())

    def layout(self, head: bool, rows: int) -> str | None:
        """The layout of the head's (`head`) or the other layers' products of `rows` rows."""
        key = (head, timed_rows(rows))
        with self._lock:
            if key not in self.chosen:
                if rows <= 4 and (not head, rows) not in self.chosen and all(self.weights.values()):
                    # a pass of 1-4 rows runs both parts at that count: timed together, each part's products
                    # reading the other's weights out of the caches, as a pass does, with no reads of their own
                    self.chosen.update(self._timed_together(rows))
                else:
                    self.chosen[key] = self._timed(head, key[1])
                if self.kept is not None:
                    self.kept.save(self.chosen)
                for part, weights in self.weights.items():  # the packed copies of a part no row count runs in
                    if PACKED not in (layout for (of, _), layout in self.chosen.items() if of == part):
                        for weight in weights:
                            _packs.pop(id(weight), None)
            chosen = self.chosen[key]
        if chosen == PACKED:  # the part's packed copies made here, where a runner counts them as one-time work
            for weight in self.weights[head]:
                _packed(weight)
        return chosen

    @torch.no_grad()
    def _timed(self, head: bool, rows: int) -> str | None:
        """The fastest layout of one part's products of `rows` rows, each round after reading the other part's
        weights."""
        weights, others = self.weights[head], self.weights[not head]
        if not weights:
            return None
        inputs = _inputs(weights, rows)
        quickest = dict.fromkeys(self.parts[head], float("inf"))
        for round in range(self.ROUNDS + 1):
            for layout in list(quickest):
                if round:
                    for other in others:  # out of the caches, as a pass finds it
                        other.sum()
                self._time(head, weights, inputs, layout, quickest, round)
        return min(quickest, key=lambda layout: quickest[layout])

    @torch.no_grad()
    def _timed_together(self, rows: int) -> dict[tuple[bool, int], str | None]:
        """The fastest layout of each part's products of `rows` rows: the layers' products and the head's in
        alternation, each part's layouts in turn (a part with fewer layouts repeats its first ones)."""
        inputs = _inputs(self.weights[False] + self.weights[True], rows)
        quickest = {head: dict.fromkeys(self.parts[head], float("inf")) for head in (False, True)}
        turns = max(len(layouts) for layouts in quickest.values())
        for round in range(self.ROUNDS + 1):
            for turn in range(turns):
                for head in (False, True):  # the layers, then the head, as a pass reads them
                    layouts = list(quickest[head])
                    layout = layouts[turn % len(layouts)]
                    self._time(head, self.weights[head], inputs, layout, quickest[head], round)
        return {(head, rows): min(times, key=lambda layout: times[layout]) for head, times in quickest.items()}

    def _time(
        self,
        head: bool,
        weights: list[torch.Tensor],
        inputs: dict[int, torch.Tensor],
        layout: str | None,
        quickest: dict[str | None, float],
        round: int,
    ) -> None:
        """The products of `weights` in `layout`, timed into `quickest` past the warm-up round (0); a layout oneDNN
        refuses for a weight leaves `quickest`. The warm-up round skips a layout that needs none."""
        if not round and layout != PACKED and (head, layout) in self.warm:
            return
        started = self.clock()
        try:
            for weight in weights:
                product(weight, inputs[weight.shape[1]], layout)
        except RuntimeError:
            if layout != PACKED:
                raise
            del quickest[layout]  # oneDNN refuses this weight: the other layouts only
            return
        self.warm.add((head, layout))
        if round:
            quickest[layout] = min(quickest[layout], self.clock() - started)


def _layouts_of_part(head: bool, weights: list[torch.Tensor]) -> list[str | None]:
    """The layouts the vocabulary head's products (`head`) or the other layers' (`weights`) can run in: oneDNN's
    packed copies where torch has oneDNN, the layers' only where they fit in _PACKED_SHARE of the memory free now (a
    copy of every weight of the model but its head)."""
    packs = _PACKED and (head or _fits_in_memory(sum(w.numel() * w.element_size() for w in weights)))
    return [None, COLUMNS, PACKED] if packs else [None, COLUMNS]


def _fits_in_memory(size: int) -> bool:
    """Whether `size` bytes are at most _PACKED_SHARE of the memory free now (not where the machine does not say)."""
    free = _free_memory()
    return free is not None and size <= _PACKED_SHARE * free


def _free_memory() -> int | None:
    """The bytes of memory the machine has free for a process to take (Linux's MemAvailable, else the free pages
    the OS reports), or None where it says neither."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _inputs(weights: list[torch.Tensor], rows: int) -> dict[int, torch.Tensor]:
    """Random rows for products with `weights`, one per input width, from a generator of their own (the caller's
    global random state stays as it was)."""
    draws = torch.Generator().manual_seed(rows)
    return {w.shape[1]: torch.randn(rows, w.shape[1], generator=draws) for w in weights}


def timed_rows(rows: int) -> int:
    """The row count whose timing picks a part's layout for `rows` rows: 1-4 themselves, more the next of 6, 8,
    12, 16, 24, ... (a power of two or three quarters of one)."""
    if rows <= 4:
        return rows
    power = 1 << (rows - 1).bit_length()
    return power * 3 // 4 if power * 3 // 4 >= rows else power


_layouts: weakref.WeakKeyDictionary[torch.nn.Module, _Layouts] = weakref.WeakKeyDictionary()

LAYOUTS_FILE = "SAMPLECHAIN_LAYOUTS"  # where the timed layouts are kept; "off": nowhere
_WIDTH_TOLERANCE = 0.1  # width prices this close to the kept ones are not written again
_WIDTH_LARGEST = 1000.0  # a call of a few tokens taking more than this many one-token calls is no timing


def kept_layouts_file() -> Path | None:
    """Where the layouts timed on this machine are kept across processes: $SAMPLECHAIN_LAYOUTS (`off`: not kept),
    else `layouts.json` in samplechain's cache folder (`samplechain.models.cache_dir()`)."""
    where = os.environ.get(LAYOUTS_FILE)
    if where is None:
        try:
            return cache_dir() / "layouts.json"
        except (RuntimeError, KeyError):  # no home folder to be found (Path.home()): nothing is kept
            return None
    return None if where.strip().lower() in ("off", "0", "") else Path(where).expanduser()


class KeptLayouts:
    """The layouts chosen for a model's weights on this machine, in a JSON file that the next process reads instead
    of timing them again (a timing reads the model's weights six to nine times a row count: 1-2 s of a first
    generation with drafts on a small model on two cores), with what the model's calls of each width took against a
    one-token call in those layouts (`save_widths`), which the next process's draft lengths start from. A record holds
    for the same weight shapes, CPU, last-level cache, torch build, oneDNN and thread count; the file keeps one record
    for each such set and set of layouts each part may run in (the layers' packed copies fit in memory or not). A
    file that cannot be read, or an entry that is not a layout or a width price, is timed again and written anew,
    with one warning."""

    warned: set[str] = set()  # the files warned about in this process

    def __init__(
        self, path: Path, weights: dict[bool, list[torch.Tensor]], parts: dict[bool, list[str | None]]
    ) -> None:
        self.path = path
        self.parts = parts
        self.widths: dict[int, float] = {}  # the width prices kept (`load`, `save_widths`)
        shapes = {("head" if head else "layers"): [list(w.shape) for w in ws] for head, ws in weights.items()}
        self.signature = {
            "cpu": _cpu(),
            "last_level_cache": _last_level_cache(),
            "torch": torch.__version__,
            "onednn": _PACKED,
            "threads": torch.get_num_threads(),
            "weights": hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16],
            "layouts": {("head" if head else "layers"): [str(x) for x in ls] for head, ls in sorted(parts.items())},
        }
        self.key = hashlib.sha256(json.dumps(self.signature, sort_keys=True).encode()).hexdigest()[:16]

    def load(self) -> dict[tuple[bool, int], str | None]:
        """The layouts kept for this signature: (head, timed rows) -> layout; its width prices go to `widths`."""
        records = self._records()
        self.widths = self._widths(records)
        return self._chosen(records)

    def save(self, chosen: dict[tuple[bool, int], str | None]) -> None:
        """Merges `chosen` into the file: another process may have kept other row counts meanwhile."""
        records = self._records()
        self._write(records, self._chosen(records) | chosen, self._widths(records))

    def save_widths(self, ratios: dict[int, float]) -> None:
        """Merges `ratios` (F -> what a call of F tokens took against a one-token call, as this process timed them)
        into the file's, unless each is within a tenth of what it keeps already: the next process's draft lengths
        start from them (`ModelRunner.kept_widths`) instead of trying every width once."""
        if all(abs(r / self.widths.get(f, math.inf) - 1) < _WIDTH_TOLERANCE for f, r in ratios.items()):
            return
        records = self._records()
        merged = self._widths(records) | ratios
        self._write(records, self._chosen(records), merged)
        self.widths = merged

    def _write(
        self, records: dict[str, Any], chosen: dict[tuple[bool, int], str | None], widths: dict[int, float]
    ) -> None:
        """`records` with this signature's record of `chosen` and `widths`, into the file."""
        entries = {f"{'head' if head else 'layers'} {rows}": layout for (head, rows), layout in sorted(chosen.items())}
        record: dict[str, Any] = {"signature": self.signature, "chosen": entries}
        if widths:
            record["widths"] = {str(f): round(r, 4) for f, r in sorted(widths.items())}
        records[self.key] = record
        try:
            write_json(self.path, records)
        except OSError as error:
            self._warn(f"it cannot be written ({error})", reads=False)

    def _widths(self, records: dict[str, Any]) -> dict[int, float]:
        """This signature's valid width prices in `records`: F (tokens a call runs, 2 or more) -> its time against
        a one-token call's."""
        record = records.get(self.key)
        entries = record.get("widths") if isinstance(record, dict) else None
        widths: dict[int, float] = {}
        for name, ratio in (entries if isinstance(entries, dict) else {}).items():
            valid = str(name).isdigit() and int(name) >= 2 and isinstance(ratio, (int, float))
            if valid and math.isfinite(ratio) and 0 < ratio <= _WIDTH_LARGEST:
                widths[int(name)] = float(ratio)
            else:
                self._warn(f"its width price {name!r}: {ratio!r} is not a call's time against a one-token call's")
        return widths

    def _chosen(self, records: dict[str, Any]) -> dict[tuple[bool, int], str | None]:
        """This signature's valid entries of `records`: (head, timed rows) -> layout."""
        record = records.get(self.key)
        entries = record.get("chosen") if isinstance(record, dict) else None
        chosen: dict[tuple[bool, int], str | None] = {}
        for name, layout in (entries if isinstance(entries, dict) else {}).items():
            part, _, count = str(name).partition(" ")
            head = part == "head"
            rows = int(count) if count.isdigit() else 0
            valid_rows = rows >= 1 and timed_rows(rows) == rows and (head or rows in LAYER_ROWS)
            if part in ("head", "layers") and valid_rows and layout in self.parts[head]:
                chosen[(head, rows)] = layout
            else:
                self._warn(f"its entry {name!r}: {layout!r} is not a layout of this machine")
        return chosen

    def _records(self) -> dict[str, Any]:
        try:
            records = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError):  # none kept yet (a folder that cannot hold it: save warns)
            return {}
        except (OSError, ValueError) as error:
            self._warn(f"it cannot be read ({error})")
            return {}
        if not isinstance(records, dict):
            self._warn("it holds no records")
            return {}
        return records

    def _warn(self, why: str, reads: bool = True) -> None:
        if str(self.path) in self.warned:
            return
        self.warned.add(str(self.path))
        then = "the layouts are timed again and the file written anew" if reads else "each process times them anew"
        warnings.warn(
            f"the linear products' layouts kept in {str(self.path)!r}: {why}; {then} "
            f"(${LAYOUTS_FILE} names another file, or 'off' keeps none)",
            GenerationWarning,
            stacklevel=4,
        )


@functools.cache
def _cpu() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what platform knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _last_level_cache() -> str | None:
    """The size of the first CPU's largest cache (Linux's sysfs), where known: a virtual machine's share of a CPU's
    cache sets whether a product's weights stay in it."""
    found: tuple[int, str] | None = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if found is None or level > found[0]:
            found = (level, size)
    return None if found is None else found[1]


def layouts_of(model: torch.nn.Module) -> _Layouts:
    """The layouts timed for `model` in this process."""
    return _layouts.get(model) or _layouts.setdefault(model, _Layouts(model))
