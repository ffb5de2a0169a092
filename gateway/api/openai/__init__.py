"""The OpenAI Chat Completions API: `parse` (bodies -> ChatRequest), `render` (chat.completion
bodies, chat.completion.chunk SSE streams, OpenAI error objects), `routes`
(`POST /v1/chat/completions`). OpenAI's error shape is also the server's default for routes
that belong to no API."""
