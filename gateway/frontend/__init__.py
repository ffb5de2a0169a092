"""The protocol-neutral front end, below the three APIs (gateway.api) and above the engine.

    ChatRequest (chat.py) --pipeline.py: media, prompt.py, affinity.py, engine submit-->
      Admission (admission.py): the admission event + EventStream (streams.py) + Timings

- `chat`: the neutral chat request every wire format is parsed into;
- `prompt`: chat template, tokenization and image placeholders -> EngineRequest;
- `affinity`: the routing key of a request (first image hash, or conversation opening);
- `pipeline`: media loading, prompt, engine submit, admission (`ChatPipeline`);
- `admission`: an admitted request and where its time went;
- `errors`: engine, prompt and model failures as APIErrors;
- `streams`: engine-thread events onto the event loop (`LoopDelivery`, `EventStream`).

Knows no HTTP and no wire format: nothing here imports `gateway.api`. The warm-up and the
cluster's replicas build on it directly.
"""
