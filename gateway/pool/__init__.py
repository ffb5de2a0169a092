"""Several models behind one endpoint: the pool of served models (`pool`), each one's slot
(`slot`), built from the configs (`build`). No MLX: each model's engine is an engine client."""
