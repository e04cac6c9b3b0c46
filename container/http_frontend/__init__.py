"""The HTTP front-ends: processes of their own (`python -m container.http_frontend …`), SERVE_HTTP_WORKERS
of them, sharing the server's HTTP listener. Each parses HTTP on its own core and hands every request
whole to the model process over the channel (container/channel/), where the one pipeline answers it; no
model lives in a front-end, and its death loses none."""
