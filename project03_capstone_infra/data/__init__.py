"""Resumable data loading and its throughput.

    python -m project03_capstone_infra data --preset 125m --batches 40
    python -m project03_capstone_infra.data ...        # the same

- `loaders`: `ResumableLoader` (PyTorch DataLoader) and `DaliLoader` (NVIDIA DALI) over the same
  deterministic token stream; `state_dict()` is the exact position in it;
- `bench`: their throughput against the in-loop stream, written as a record.
The report (chart, Markdown) is rendered from the JSON record by `report/data.py`.
"""
