"""The OpenAI Responses API: `parse` (bodies -> ResponsesRequest), `turn` (one turn's whole
conversation as a ChatRequest, stored images reused), `store` (stored responses and their
decoded images, bounded), `render` (response bodies and the response.* event stream), `routes`
(`POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`)."""
