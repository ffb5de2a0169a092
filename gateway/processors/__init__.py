"""The prompt side of each model family, without weights and without MLX: chat template and
tokenizer, image and video grids and layouts (`processor.PromptProcessor`, one subclass per
family that has its own), and the numpy pieces both sides share: `positions` (image spans
and mRoPE positions), `video_layout`, `image_processor` and `video_processor` (pixels equal
to the checkpoints' processors, run by the engine, which owns pixel preparation).

A floor below the engine: the engine-side families build their processor from what they
loaded, and the front end takes it (through `wire.Ready` from the engine process). Nothing
here imports MLX, mlx-lm, mlx-vlm or the engine (tests/gateway/processors pin it).
"""
