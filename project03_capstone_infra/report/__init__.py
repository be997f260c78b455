"""Every project03 report rendered from its JSON record alone, one module per experiment:
`chaos`, `checkpoint_bench`, `cost`, `data`, `reshard`, `tune` (each `render(record, out_dir)`
-> the files written), `summary` (summary.md over all records) and `render` (the `report`
command: all of them again, nothing rerun).

    python -m project03_capstone_infra report [--reports-dir DIR]
"""
