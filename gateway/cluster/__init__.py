"""Scale-out: N engine replicas as Ray Serve deployments behind one ingress
(`vision-gateway cluster`, docs/scale-out.md).

- `router`: consistent hashing with bounded loads over replica slots (pure Python);
- `routed_engine`: the ingress's engine client over the replicas (the HTTP app is `serve`'s),
  with `fanout` for the stats and metrics calls to every replica;
- `replica`: the Serve deployment that hosts one engine;
- `stats`: cache stats, metrics and entries merged over replicas;
- `cli`, `config`: the command's flags and settings; `launch`: Ray start/join, deployment,
  the ingress server; `simulate`: hit-rate simulation.

The routing key of a request (first image hash, or conversation opening) is the front end's
(`gateway.frontend.affinity`). Only `routed_engine` and `launch` import Ray (the `cluster`
extra); `serve` imports nothing here but `cli` (the command line lists the `cluster` command).
"""
