"""Scale-out: N engine replicas as Ray Serve deployments behind one ingress
(`vision-gateway cluster`, docs/scale-out.md).

- `router`: consistent hashing with bounded loads over replica slots (pure Python);
- `affinity`: the routing key of a request (first image hash, or conversation opening);
- `routed_engine`: the ingress's engine client over the replicas (the HTTP app is `serve`'s);
- `replica`: the Serve deployment that hosts one engine;
- `stats`: cache stats, metrics and entries merged over replicas;
- `launch`: Ray start/join, deployment, the ingress server; `simulate`: hit-rate simulation.

Only `replica`, `routed_engine` and `launch` need Ray (the `cluster` extra), imported lazily.
"""
