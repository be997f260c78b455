"""apple_track: the on-device path (Core ML, LiteRT, MLX, Metal). Not built yet: see README.md."""
