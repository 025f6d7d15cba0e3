"""The KServe v2 / Open Inference Protocol server: wire format, routes and process lifecycle.

Its modules, each importing only from those above it:

- ``tensors``: the tensor codecs (binary layouts, JSON data lists); pure.
- ``messages``: the request and response records, ``ProtocolError``; pure.
- ``requests`` / ``responses``: bodies to records, records to bodies; pure.
- ``inference``: a request checked against its model, the model's outputs shaped; pure.
- ``registry``: the served models, their batchers, metadata, config and statistics.
- ``statuses``: the one table from exceptions to HTTP statuses (and gRPC codes); ``HTTPError``.
- ``grpc_codec``: Triton's gRPC messages (tritonclient's stubs) to those records and back; pure.
- ``openai``: OpenAI's embeddings and models bodies to and from those records; pure.
- ``openapi``: the OpenAPI 3 document of the REST routes, served at ``/v2/openapi.json``; pure.
- ``auth``: API keys: which a request presents, constant-time checks, the open routes; pure.
- ``asgi`` / ``bodies``: ASGI plumbing; request bodies within the size limit and body timeout.
- ``connections``: uvicorn's HTTP protocol with a header-read timeout and a JSON 503 past
  ``--limit-concurrency``.
- ``buckets`` / ``metrics``: ``/metrics`` histogram buckets (pure); Prometheus exposition.
- ``app``: the ASGI application: lifespan, routes, the inference endpoint.
- ``grpc_access``: the gRPC API-key interceptor and its port, with TLS or without.
- ``loop_bridge``: coroutines from the gRPC thread's loop run on the app's, in bursts.
- ``grpc_service``: the gRPC API on the app's models, in a thread (the app starts it, importing
  it only when the gRPC port is on).
- ``config`` / ``serve``: the process's settings; bind, serve, drain on a signal.
"""
