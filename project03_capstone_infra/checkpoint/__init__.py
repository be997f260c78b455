"""Versioned, verified, sharded checkpoints on top of `torch.distributed.checkpoint` (DCP).

One module per role; import from the module that owns a name:
- `layout`: the names on disk, the manifest's schema and typed loader, checksums, the atomic
  commit, and what a checkpoint root holds (`list_checkpoints`, `read_latest`);
- `state`: the non-tensor state a save carries (the caller's JSON, every rank's RNG states);
- `safe_read`: reading DCP's files without running code from them;
- `verify`: whether a step directory is usable, and quarantine of the ones that are not;
- `retention`: which checkpoints to keep, counted over those that verify;
- `lock`: one trainer per checkpoint directory;
- `stager`: `PersistentStager`, host buffers for asynchronous saves kept across saves;
- `manager`: `CheckpointManager`, save / load / retention / fallback for one run (its docstring
  says what DCP provides and what the manager adds);
- `compare`: bitwise comparison of two states or checkpoints;
- `__main__`: `python -m project03_capstone_infra.checkpoint list | verify | prune | compare`.
"""
