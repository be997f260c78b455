"""Every parallelism of project02, applied from outside the plain `shared.model.Transformer`
(the torchtitan way): `mesh` (the device mesh of a layout), `tp` (tensor and sequence parallel
plans), `pipeline` (stages and schedules), `data` (FSDP2 and DDP), `apply` (a layout onto a
model: what the training loop drives), `checkpoint` (DCP state that loads under any layout).
"""
