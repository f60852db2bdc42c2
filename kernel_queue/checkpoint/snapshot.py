"""What a checkpoint holds: the kernel's namespace through dill, big arrays and tensors out of band.

`save` test-pickles each user variable (`selection`), skips (and reports) what cannot be pickled,
and dumps the rest as dill's session pickle of the real `__main__`, sending numpy arrays and torch
tensors of 1 MiB or more to their own `.npy`/`.pt` files. `restore` checks every file's digest,
then loads it back into a module. Runs inside the kernel: stdlib, dill and numpy
only; torch only if the user imported it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping
from types import ModuleType, SimpleNamespace
from typing import IO, TYPE_CHECKING, Any

import dill  # type: ignore[import-untyped]
import dill.session  # type: ignore[import-untyped]

from kernel_queue.checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointDamaged,
    CheckpointError,
    CheckpointStore,
    CheckpointWriter,
    FormatMismatch,
    RestoreReport,
    SaveReport,
    arrays,
    digests,
    packs,
    payloads,
    references,
    selection,
)

if TYPE_CHECKING:
    import numpy as np
else:
    np = arrays.NUMPY

NAMESPACE = "namespace.pkl"
PICKLE_PROTOCOL = selection.PICKLE_PROTOCOL
CONSISTENCIES = ("consistent", "concurrent")
_LAST = ("last_type", "last_value", "last_traceback", "last_exc")
_DILL_LISTS = ("__dill_imported", "__dill_imported_as", "__dill_imported_top_level")
_VALUES = (int, float, complex, str, bytes, tuple, frozenset)  # never worth saving by reference
_OWN_FIELDS = frozenset(
    {"format", "created", "consistency", "module", "namespace", "pickle_protocol", "versions"}
    | {"saved", "skipped", "payload", "bytes", "seconds", "files", "base", "reused"}
)


def save(
    module: ModuleType,
    store: CheckpointStore,
    *,
    hidden: Collection[str] = (),
    deadline: float | None = None,
    consistency: str = "consistent",
    extra: Mapping[str, Any] | None = None,
    base: Checkpoint | None = None,
    known: Mapping[int, tuple[int, str]] | None = None,
    history: payloads.History | None = None,
) -> SaveReport:
    """Checkpoint the user variables of `module` (the IPython user module) into `store`.

    With `base` (a committed checkpoint of the same store) the save is incremental: an array
    whose bytes hash to the digest of one of `base`'s array files is not written again but
    linked from it (`DirectoryWriter.link`), so a checkpoint after a cell that changed one
    array writes that array, the namespace pickle and the manifest; every checkpoint directory
    still holds all its files. `known` (id -> bytes and digest, from an earlier report's
    `digests`) spares hashing arrays the caller knows unchanged since: only for arrays no code
    can have touched (nothing ran since that save's snapshot), else a stale file is linked.
    `history` (page tracking since `base`'s snapshot) spares hashing arrays whose pages were
    not written since (linked by their digest in `base`) and those whose pages were (written).

    Called by the in-kernel extension on preemption. The user's namespace is never modified
    (skipped names are left out of a copy, not popped), so a cell may run meanwhile (then pass
    `consistency="concurrent"`). Never raises for what happens while saving: a passed
    `deadline` (a `time.monotonic()` value) or an error aborts the new checkpoint, keeps the
    previous one and is reported in `SaveReport.error`. Raises ValueError only for bad
    arguments (`consistency`, `extra` fields that clash with the manifest's own).
    """
    if consistency not in CONSISTENCIES:
        raise ValueError(f"consistency must be one of {CONSISTENCIES}, not {consistency!r}")
    clash = sorted(_OWN_FIELDS.intersection(extra or {}))
    if clash:
        raise ValueError(f"extra manifest fields clash with the manifest's own: {clash}")
    started, created = time.monotonic(), time.time()
    saved: list[tuple[str, str, int]] = []
    skipped: list[tuple[str, str, str]] = []
    payload: list[dict[str, Any]] = []
    external: payloads.OutOfBand | None = None
    writer: CheckpointWriter | None = None
    checkpoint: Checkpoint | None = None
    error = ""
    try:
        with _without_last_exception():
            tensors = payloads.tensor_types()
            saved, skipped = selection.select(module, hidden, deadline, tensors)
            writer = store.begin()
            roots = _roots(module, {name for name, _, _ in saved})
            reuse = reusable(base)
            external = payloads.OutOfBand(
                writer, module, deadline, payload, tensors, roots, reuse, known, history
            )
            file = writer.open(NAMESPACE)
            _dump(file, module, {name for name, _, _ in saved}, hidden, external)
            external.packer.close(payload)
            payload.insert(0, {"file": NAMESPACE, "kind": "pickle", "bytes": file.tell()})
            file.close()
            payloads.check(deadline)
            manifest = {
                **(extra or {}),
                "format": FORMAT_VERSION,
                "created": created,
                "consistency": consistency,
                "module": module.__name__,
                "namespace": NAMESPACE,
                "pickle_protocol": PICKLE_PROTOCOL,
                "versions": _versions(),
                "saved": [{"name": n, "type": t, "bytes": b} for n, t, b in saved],
                "skipped": [{"name": n, "type": t, "reason": r} for n, t, r in skipped],
                "payload": payload,
                "bytes": sum(entry["bytes"] for entry in payload),
                "reused": _reused(payload),
                "seconds": round(time.monotonic() - started, 3),
            }
            if base is not None:
                manifest["base"] = base.id
            checkpoint = writer.commit(manifest)
    except payloads.DeadlinePassed:
        error = "deadline"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if checkpoint is None and writer is not None:
            writer.abort()
    return SaveReport(
        checkpoint=checkpoint,
        saved=tuple((name, size) for name, _, size in saved) if checkpoint else (),
        skipped=tuple(skipped),
        bytes=sum(entry["bytes"] for entry in payload),
        seconds=time.monotonic() - started,
        consistency=consistency,
        error=error,
        reused=_reused(payload) if checkpoint else 0,
        digests=external.digests if checkpoint and external else {},
        places=external.places if checkpoint and external else {},
    )


def reusable(base: Checkpoint | None) -> dict[str, Any]:
    """Digest -> path of each array file of `base` (empty without one): what a save may link."""
    if base is None:
        return {}
    files = base.manifest.get("files", {})
    found = {}
    for entry in base.manifest.get("payload", ()):
        record = files.get(entry.get("file")) if isinstance(entry, dict) else None
        if entry.get("kind") == "ndarray" and isinstance(record, dict):
            found[str(record.get("digest"))] = base.path / str(entry["file"])
    return found


def _reused(payload: list[dict[str, Any]]) -> int:
    return sum(entry["bytes"] for entry in payload if entry.get("reused"))


def restore(module: ModuleType, checkpoint: Checkpoint) -> RestoreReport:
    """Load `checkpoint`'s variables into `module` (the IPython user module of a fresh kernel).

    Called by `recover` (and tools) before the kernel serves requests; the caller marks the
    checkpoint restored in its store. Every file is read and its digest checked before anything
    is unpickled: CheckpointDamaged then, with `module` untouched. A name imported by reference
    that no longer imports is reported in `skipped`; FormatMismatch for a manifest of another
    format; unpickling errors propagate (the namespace may then be partly restored).
    """
    manifest = checkpoint.manifest
    if manifest.get("format") != FORMAT_VERSION:
        raise FormatMismatch(
            f"checkpoint {checkpoint.id} was written in checkpoint format "
            f"{manifest.get('format')!r}, but this kernel-queue reads format {FORMAT_VERSION} "
            "only; restore it with the kernel-queue version that wrote it, or start afresh"
        )
    try:
        stream = io.BytesIO(_read(checkpoint, str(manifest["namespace"])))
        loaded = {
            str(entry["file"]): payloads.read(checkpoint.path, entry, _file(checkpoint, entry))
            for entry in manifest["payload"]
            if entry.get("kind") != "pickle"
        }
    except digests.Mismatch as exc:
        raise CheckpointDamaged(f"checkpoint {checkpoint.id} is damaged: {exc}") from exc
    built: dict[str, Any] = {}
    small = loaded.pop(packs.FILE, None) or packs.Unpacker(bytearray())

    def persistent_load(pid: tuple[Any, ...]) -> Any:
        kind = pid[0]
        if kind == "main":
            return module
        if kind == "main-dict":
            return module.__dict__
        if kind in ("view", "module", "global"):
            return references.rebuild(pid)
        if kind == "small":
            return small.array(pid)
        name = pid[1]
        if name not in built:  # a persistent id comes once per reference: build it once
            if name not in loaded:
                raise CheckpointError(f"checkpoint {checkpoint.id} lists no payload {name}")
            built[name] = payloads.build(loaded.pop(name), pid)
        return built[name]

    saved_as = str(manifest["module"])

    def import_module(name: str, safe: bool = False) -> Any:
        if name in (saved_as, "__runtime__." + saved_as):
            return module
        return dill._dill._import_module(name, safe)

    keep = {k: v for k, v in vars(module).items() if k.startswith("__") and k.endswith("__")}
    with stream as file:
        unpickler = dill.Unpickler(file)
        find_class = unpickler.find_class

        def find(module_name: str, name: str) -> Any:
            if module_name in ("dill._dill", "dill.dill") and name == "_import_module":
                return import_module
            return find_class(module_name, name)

        # dill.load_module() takes no persistent_load: configure its Unpickler the same way.
        unpickler.persistent_load = persistent_load
        unpickler.find_class = find
        unpickler._main, unpickler._session = module, True
        unpickler.load()
    failed = _import_references(module, find_class)
    vars(module).update(keep)
    lost = {name for name, _, _ in failed}
    saved = [(str(e["name"]), int(e["bytes"])) for e in manifest.get("saved", ())]
    recorded = [(str(e["name"]), str(e["type"]), str(e["reason"])) for e in manifest["skipped"]]
    return RestoreReport(
        checkpoint=checkpoint,
        restored=tuple((name, size) for name, size in saved if name not in lost),
        skipped=(*recorded, *failed),
        age_seconds=max(0.0, time.time() - checkpoint.created),
        consistency=str(manifest.get("consistency", "consistent")),
    )


def _file(checkpoint: Checkpoint, entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """The store's record (bytes, digest) of a payload file the snapshot lists."""
    name = str(entry["file"])
    record = checkpoint.manifest.get("files", {}).get(name)
    if not isinstance(record, dict):
        raise digests.Mismatch(f"its manifest has no digest for {name}")
    return record


def _read(checkpoint: Checkpoint, name: str) -> bytearray:
    record = _file(checkpoint, {"file": name})
    return digests.read(checkpoint.path / name, int(record["bytes"]), str(record["digest"]))


def _roots(module: ModuleType, names: set[str]) -> set[int]:
    """Ids of the saved variables that are arrays owning their memory: views onto them are
    saved as views (a view of anything else is saved as a copy of its elements, so a small
    view never drags a big unsaved array into the checkpoint)."""
    found = set()
    for name in names:
        value = module.__dict__.get(name)
        if type(value) is np.ndarray and value.base is None:
            found.add(id(value))
    return found


def _dump(
    file: IO[bytes],
    module: ModuleType,
    names: set[str],
    hidden: Collection[str],
    external: payloads.OutOfBand,
) -> None:
    """`dill.dump_module(file, module=module, refimported=True)` of `names` plus the modules.

    dill.dump_module() builds its own Pickler, which cannot be given a persistent_id, so this
    repeats its setup. It pickles a copy of the module holding only what is saved (as dill does
    itself for `refimported`); `_original_main` makes dill map the functions' `__globals__` (the
    real namespace) to that copy, so nothing unsaved is dragged in and the user's namespace is
    never modified, even while a cell runs.
    """
    stash = _stash(module)
    copy = ModuleType(module.__name__)
    for dunder in ("__doc__", "__package__", "__spec__", "__loader__"):
        del copy.__dict__[dunder]

    def kept(name: str, value: Any) -> bool:  # the saved variables, and modules by reference
        return name in names or (
            isinstance(value, ModuleType) and name not in hidden and not name.startswith("_")
        )

    refs: dict[str, list[tuple[str, ...]]] = {key: [] for key in _DILL_LISTS}
    for key in _DILL_LISTS:
        for ref in getattr(stash, key, ()) if stash is not module else ():
            value = module.__dict__.get(ref[-1])
            if ref[-1] in names and isinstance(value, _VALUES):
                copy.__dict__[ref[-1]] = value  # a number imported by name: keep its value
            elif kept(ref[-1], value):
                refs[key].append(ref)
    for name, value in dict(vars(stash)).items():
        if kept(name, value):
            if value is stash or value is module:  # `me = sys.modules[__name__]`
                value = copy
            elif value is vars(stash) or value is vars(module):  # `namespace = globals()`
                value = vars(copy)
            copy.__dict__[name] = value
    copy.__dict__.update(refs)
    pickler = dill.Pickler(file, PICKLE_PROTOCOL)
    pickler.persistent_id = external.persistent_id
    pickler._original_main, pickler._main, pickler._main_modified = module, copy, True
    pickler._byref, pickler._recurse = False, False
    pickler._session, pickler._first_pass = True, True
    pickler.dispatch = _with_number_lists(pickler.dispatch)
    pickler.dump(copy)


_NUMBERS = frozenset({int, float, bool, type(None)})
NUMBER_LIST = 64
"""Lists of at least this many numbers are pickled by the C pickler (`_with_number_lists`)."""


def _with_number_lists(dispatch: Any) -> Any:
    """dill's dispatch table, but a list of numbers (a loss history) is pickled by the C pickler
    in one call, ~40 times faster than item by item in dill's Python pickler, into the same
    opcodes: the list itself is memoized as usual (a second reference to it stays one object);
    its items, numbers and None, need no memo and are never persistent ids."""
    table = type(dispatch)(dispatch)  # dill's MetaCatchingDict, copied
    save_list = table[list]

    def save_number_list(pickler: Any, obj: list[Any]) -> None:
        if len(obj) >= NUMBER_LIST and set(map(type, obj)) <= _NUMBERS:
            buffer = io.BytesIO()
            inner = pickle.Pickler(buffer, 3)  # no frames, so it splices into the outer ones
            inner.fast = True  # no memo: EMPTY_LIST, MARK, the items, APPENDS
            try:
                inner.dump(obj)
            except Exception:  # changed meanwhile (a concurrent save): item by item
                pass
            else:
                data = buffer.getbuffer()
                pickler.write(bytes(data[2:3]))  # after PROTO 3: EMPTY_LIST
                pickler.memoize(obj)
                pickler.write(bytes(data[3:-1]))  # without STOP
                return
        save_list(pickler, obj)

    table[list] = save_number_list
    return table


def _import_references(
    module: ModuleType, find_class: Callable[[str, str], Any]
) -> list[tuple[str, str, str]]:
    """Put back what `_stash` saved by reference (dill's `_restore_modules`, but one name that no
    longer imports is reported instead of failing the whole restore)."""
    namespace, failed = vars(module), []
    names = [(m, n, n) for m, n in namespace.pop("__dill_imported", ())]
    names += [(m, o, n) for m, o, n in namespace.pop("__dill_imported_as", ())]
    for module_name, attribute, name in names:
        try:
            namespace[name] = find_class(module_name, attribute)
        except Exception as exc:
            failed.append(
                (name, "reference", f"{module_name}.{attribute}: {selection.reason(exc)}")
            )
    for module_name, name in namespace.pop("__dill_imported_top_level", ()):
        try:
            namespace[name] = importlib.import_module(module_name)
        except Exception as exc:
            failed.append((name, "module", selection.reason(exc)))
    return failed


def _stash(module: ModuleType) -> ModuleType:
    """dill's `refimported` split of `module` (imported objects become references)."""
    for _ in range(5):
        with contextlib.suppress(RuntimeError):  # "dictionary changed size": a cell is running
            return _stash_modules(module)
    raise RuntimeError("the namespace kept changing while it was being saved")


def _stash_modules(main: ModuleType) -> ModuleType:
    """`dill.session._stash_modules(main)`, the same module, on a `_module_map` of only what it
    looks up: dill's maps every name and object of every imported module (0.5-1.4 s a save with
    torch's 1,200 modules imported, most of it building lists the save never reads)."""
    session = dill.session
    modmap = _module_map(vars(main))
    stash = ModuleType(main.__name__)
    imported: list[tuple[str, str]] = []
    imported_as: list[tuple[str, str, str]] = []
    imported_top_level: list[tuple[str, str]] = []
    original: dict[str, Any] = {}
    for name, obj in vars(main).items():
        if obj is main:
            original[name] = stash
        elif obj is vars(main):
            original[name] = vars(stash)
        elif any(obj is singleton for singleton in (None, False, True)) or (
            isinstance(obj, ModuleType) and session._is_builtin_module(obj)
        ):
            original[name] = obj
        else:
            source, objname = session._lookup_module(modmap, name, obj, main)
            if source is not None:
                if objname == name:
                    imported.append((source, name))
                else:
                    imported_as.append((source, objname, name))
            elif id(obj) in modmap.top_level:
                imported_top_level.append((modmap.top_level[id(obj)], name))
            else:
                original[name] = obj
    if len(original) == len(vars(main)):
        return main
    vars(stash).update(original)
    vars(stash)["__dill_imported"] = imported
    vars(stash)["__dill_imported_as"] = imported_as
    vars(stash)["__dill_imported_top_level"] = imported_top_level
    if getattr(stash, "__loader__", None) is None and session._is_imported_module(main):
        vars(stash)["__loader__"] = True  # as dill does: makes it save as an imported module
    return stash


def _module_map(namespace: Mapping[str, Any]) -> SimpleNamespace:
    """dill's `_module_map()` cut to the entries `_lookup_module` reads for `namespace`: of each
    imported module, in the same order, the attributes of the namespace's names (`by_name`) and
    those that are one of its values (`by_id`); every top-level module (`top_level`)."""
    names, ids = set(namespace), {id(value) for value in namespace.values()}
    by_name: defaultdict[str, list[tuple[Any, str]]] = defaultdict(list)
    by_id: defaultdict[int, list[tuple[Any, str, str]]] = defaultdict(list)
    top_level: dict[int, str] = {}
    for modname, imported in list(sys.modules.items()):
        if modname in ("__main__", "__mp_main__") or not isinstance(imported, ModuleType):
            continue
        if "." not in modname:
            top_level[id(imported)] = modname
        for objname, modobj in vars(imported).items():
            if objname in names:
                by_name[objname].append((modobj, modname))
            if id(modobj) in ids:
                by_id[id(modobj)].append((modobj, objname, modname))
    return SimpleNamespace(by_name=by_name, by_id=by_id, top_level=top_level)


@contextlib.contextmanager
def _without_last_exception() -> Iterator[None]:
    """Clear `sys.last_*` while saving: with `refimported` dill would save an exception class
    raised in the session as a reference to `sys.last_type`, which a fresh kernel lacks."""
    kept = {name: getattr(sys, name) for name in _LAST if hasattr(sys, name)}
    for name in kept:
        delattr(sys, name)
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(sys, name, value)


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "dill": dill.__version__}
    if arrays.version() is not None:
        versions["numpy"] = str(arrays.version())
    if "torch" in sys.modules:
        versions["torch"] = str(getattr(sys.modules["torch"], "__version__", "?"))
    return versions
