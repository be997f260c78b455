"""apple_track: the on-device path for the shared transformer.

- `apple_track.model`: the fixed-shape export wrapper, the variant lists, the stated
  tolerances, the export config (needs only PyTorch).
- `apple_track.coreml_export`: Core ML ML program in float16 and compressed variants.
- `apple_track.litert_export`: LiteRT (TFLite) float32 and int8 through litert-torch.
- `apple_track.mlx_model`: the transformer in MLX, loading the PyTorch weights.
- `apple_track.metal_kernels`: Metal matmul ladder and fused attention via mx.fast.metal_kernel.
- `apple_track.export` / `report` / `profile`: the commands (`python -m apple_track --help`).

The exporters need the track's own environment (`make -f apple_track/Makefile setup`); the
modules import their runtime only when used, so `import apple_track` works anywhere.
"""

PROJECT = __name__  # the results folder: reports/<PROJECT>/
