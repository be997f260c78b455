"""Reading DCP checkpoints without running anything that a checkpoint file says.

DCP stores two kinds of pickle. Its index, `.metadata`, is a pickle that torch's
`FileSystemReader.read_metadata` opens with `pickle.load`; every non-tensor value of the state
(the trainer's JSON blob, the RNG states, the optimizer's hyperparameters) is a `torch.save`
pickle that DCP's `DefaultLoadPlanner.load_bytes` opens with `torch.load(weights_only=False)`.
Either would run whatever code a crafted file names, and checksums do not help: whoever can
write a checkpoint's files can rewrite its manifest too. So this module replaces both readers:

- `.metadata` is unpickled by `_MetadataUnpickler`, which resolves only the classes DCP's metadata
  is made of (`torch.distributed.checkpoint.metadata`, `filesystem._StorageInfo`, `torch.Size`,
  dtypes, layouts, paths); any other global (`os.system`, `builtins.exec`, ...) is refused before
  it is called. The result is then checked for shape: every storage entry must point into a file
  the manifest names, within its recorded size, with no storage transforms.
- non-tensor values are read with `torch.load(weights_only=True)` (`SafeLoadPlanner`), which
  builds only tensors and plain containers; tensors DCP already reads with `weights_only=True`.

`check_dcp_content` runs both over a step directory without loading the tensors, so that
verification (`checkpoint verify`, resume) rejects a crafted checkpoint before anything is loaded;
the reader and planner repeat the checks where the data is actually read.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from .layout import METADATA, CheckpointError, Manifest, load_manifest

_MAX_INDEX = 1 << 20  # a list index in DCP's planner data (param groups): far below this


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file asked for something the safe readers do not do (e.g. run code)."""


_DCP_META = "torch.distributed.checkpoint.metadata"
_ALLOWED_GLOBALS = {
    (_DCP_META, "Metadata"),
    (_DCP_META, "TensorStorageMetadata"),
    (_DCP_META, "BytesStorageMetadata"),
    (_DCP_META, "ChunkStorageMetadata"),
    (_DCP_META, "TensorProperties"),
    (_DCP_META, "MetadataIndex"),
    (_DCP_META, "StorageMeta"),
    (_DCP_META, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout's name to the torch.layout
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
    ("pathlib._local", "PosixPath"),  # Python >= 3.13 spells the module so
    ("pathlib._local", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals DCP's metadata is made of (and torch dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"{METADATA} refers to {module}.{name}, which is not one of the classes DCP's "
            "metadata is made of: refused, nothing was run"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(f"{METADATA} holds a persistent reference: refused")


def load_metadata(path: str | os.PathLike, manifest: Manifest):
    """DCP's `Metadata` of the step directory `path`, unpickled with the allow-list and checked
    against `manifest` (every storage entry inside a file the manifest names)."""
    mpath = Path(path) / METADATA
    try:
        fd = os.open(mpath, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{METADATA} cannot be read ({e.strerror or e})") from None
    try:
        md = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a crafted pickle is a bad file
        raise UnsafeCheckpointError(
            f"{METADATA} is not a DCP metadata pickle ({type(e).__name__}: {e})"
        ) from None
    check_metadata(md, manifest)
    return md


def check_metadata(md: Any, manifest: Manifest) -> None:
    """Shape checks of unpickled metadata: the types DCP uses, and storage confined to files the
    manifest names, within their recorded sizes. Raises UnsafeCheckpointError."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    def bad(what: str) -> UnsafeCheckpointError:
        return UnsafeCheckpointError(f"{METADATA}: {what}: refused")

    if not isinstance(md, Metadata):
        raise bad(f"holds a {type(md).__name__}, not DCP's Metadata")
    sdm = md.state_dict_metadata
    if not isinstance(sdm, dict):
        raise bad("state_dict_metadata is not a dict")
    for key, entry in sdm.items():
        if not isinstance(key, str):
            raise bad(f"key {key!r} is not a string")
        if not isinstance(entry, (TensorStorageMetadata, BytesStorageMetadata)):
            raise bad(f"entry {key!r} is a {type(entry).__name__}")
        if isinstance(entry, TensorStorageMetadata) and not (
            isinstance(entry.size, torch.Size) and isinstance(entry.properties.dtype, torch.dtype)
        ):
            raise bad(f"tensor entry {key!r} has no valid size or dtype")
    storage = md.storage_data
    if not isinstance(storage, dict):
        raise bad("storage_data is not a dict")
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str):
            raise bad(f"storage key {index!r} is not a MetadataIndex")
        if index.fqn not in sdm:
            raise bad(f"storage entry for {index.fqn!r}, which the state does not list")
        if not isinstance(info, _StorageInfo):
            raise bad(f"storage of {index.fqn!r} is a {type(info).__name__}")
        name = info.relative_path
        if not isinstance(name, str) or name == METADATA or name not in manifest.files:
            raise bad(
                f"{index.fqn!r} is stored in {name!r}, a file the manifest does not name "
                "(only the manifest's shard files are read)"
            )
        for what in ("offset", "length"):
            v = getattr(info, what)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(f"{index.fqn!r} has {what} {v!r}")
        if info.offset + info.length > manifest.files[name].bytes:
            raise bad(
                f"{index.fqn!r} lies at bytes {info.offset}..{info.offset + info.length} of "
                f"{name}, which has {manifest.files[name].bytes}"
            )
        if getattr(info, "transform_descriptors", None):
            raise bad(f"{index.fqn!r} asks for storage transforms {info.transform_descriptors!r}")
    planner_data = md.planner_data
    if planner_data is not None:
        if not isinstance(planner_data, dict):
            raise bad("planner_data is not a dict")
        for key, path in planner_data.items():
            ok = (
                isinstance(key, str)
                and isinstance(path, (tuple, list))
                and all(
                    isinstance(p, str) or (type(p) is int and 0 <= p < _MAX_INDEX) for p in path
                )
            )
            if not ok:
                raise bad(f"planner_data[{key!r}] is not a path of names and small indices")


def load_bytes_entry(data: io.BytesIO | bytes, fqn: str) -> Any:
    """A non-tensor value of the state: `torch.load(weights_only=True)` builds only tensors and
    plain containers and refuses any other global."""
    buf = data if isinstance(data, io.BytesIO) else io.BytesIO(data)
    try:
        return torch.load(buf, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - UnpicklingError and whatever a crafted file raises
        first = str(e).strip().splitlines()
        raise UnsafeCheckpointError(
            f"entry {fqn!r} is not a plain value (refused by torch.load(weights_only=True): "
            f"{first[-1][:200] if first else type(e).__name__}); nothing was run"
        ) from None


def check_dcp_content(path: str | os.PathLike, manifest: Manifest) -> None:
    """Reject what the safe readers would reject, without loading tensors: `.metadata` through
    the allow-list, then every non-tensor entry through `weights_only`."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    path = Path(path)
    md = load_metadata(path, manifest)
    by_file: dict[str, list] = {}
    for index, info in md.storage_data.items():
        if isinstance(md.state_dict_metadata[index.fqn], BytesStorageMetadata):
            by_file.setdefault(info.relative_path, []).append((index.fqn, info))
    for name, items in sorted(by_file.items()):
        try:
            fd = os.open(path / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            raise CheckpointError(f"{name} cannot be read ({e.strerror or e})") from None
        with open(fd, "rb") as f:
            for fqn, info in items:
                f.seek(info.offset)
                load_bytes_entry(f.read(info.length), fqn)


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with the allow-listed metadata unpickler and the manifest's files only.
    `refusal` keeps the first refusal, so that a caller can report it as it was."""

    def __init__(self, path: str | os.PathLike, manifest: Manifest) -> None:
        super().__init__(path)
        self.manifest = manifest
        self.refusal: str | None = None

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata: not ours
            raise UnsafeCheckpointError("per-rank metadata files are not read")
        try:
            md = load_metadata(self.path, self.manifest)
        except CheckpointError as e:
            self.refusal = self.refusal or str(e)
            raise
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args, **kwargs) -> None:
        try:  # whatever metadata DCP hands us, the same confinement holds
            check_metadata(metadata, self.manifest)
        except CheckpointError as e:
            self.refusal = self.refusal or str(e)
            raise
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)


class _SafeBytes:
    """`load_bytes` through `torch.load(weights_only=True)`, for DCP's load planners; `refusal`
    keeps the first refusal (DCP wraps exceptions per rank)."""

    refusal: str | None = None

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        try:
            obj = load_bytes_entry(value, fqn)
        except CheckpointError as e:
            self.refusal = self.refusal or str(e)
            raise
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class SafeLoadPlanner(_SafeBytes, DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values with `weights_only=True`."""


def read_full_state(path: str | os.PathLike) -> dict[str, Any]:
    """Every entry of a DCP checkpoint as plain CPU tensors / objects, keyed by flat name
    (e.g. 'model.layers.0.attention.wqkv.weight'), whatever world size wrote it. Reads only the
    files its manifest names, through the safe readers above (it does not verify checksums:
    `verify_checkpoint` does)."""
    import warnings

    # DCP's own converter (format_utils.dcp_to_torch_save) does exactly this with the unsafe
    # reader and planner; the planner that builds the state from the metadata is private.
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeEmptyPlanner(_SafeBytes, _EmptyStateDictLoadPlanner):
        pass

    manifest = load_manifest(path)
    reader = SafeFileSystemReader(path, manifest)
    reader.read_metadata()  # refused here, before DCP (which would retry per-rank files)
    planner = SafeEmptyPlanner()
    state: dict[str, Any] = {}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": intended here
        warnings.simplefilter("ignore", UserWarning)
        try:
            _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException
            refusal = reader.refusal or planner.refusal
            if refusal:
                raise UnsafeCheckpointError(f"{Path(path).name}: {refusal}") from None
            raise CheckpointError(f"{Path(path).name}: {first_error(e)}") from e
    flat: dict[str, Any] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = obj

    walk("", state)
    return flat


def first_error(e: BaseException) -> str:
    """The message of the first failure inside DCP's CheckpointException (one per rank), else
    the exception's own first line."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict):
        for wrapped in failures.values():
            inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
            if isinstance(inner, BaseException):
                return str(inner)
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
