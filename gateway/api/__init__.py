"""The HTTP edge: the three APIs' wire formats over the protocol-neutral front end
(gateway.frontend).

    HTTP request --intake.py (API key, drain check, bounded JSON body)-->
      --<api>/parse.py--> ChatRequest --gateway.frontend.pipeline--> Admission
      --<api>/render.py--> JSON or SSE (routes in <api>/routes.py)

- `openai/`: Chat Completions (`POST /v1/chat/completions`);
- `anthropic/`: Messages (`POST /v1/messages`, `/v1/messages/count_tokens`);
- `responses/`: OpenAI Responses (`/v1/responses` and its stored conversations);
- shared: `intake` (a request read off HTTP and handed to the pipeline), `http` (API keys,
  JSON bodies, disconnects, per-route error rendering), `body_budget` (bytes of bodies being
  read at once), `fields` (validation of single JSON fields), `sse` (event-stream framing).

Each API owns its parser, its response bodies and its error renderer; everything below them
(media, prompt building, the engine) is the front end's. Nothing outside this package and
`gateway.app` imports it (the web pages use `http.authorize`).
"""
