"""The Anthropic Messages API: `parse` (bodies -> ChatRequest, a final assistant message as a
prefill), `render` (message bodies, the Messages event stream, Anthropic error objects),
`routes` (`POST /v1/messages`, `POST /v1/messages/count_tokens`)."""
