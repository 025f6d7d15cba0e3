"""The KServe v2 / Open Inference Protocol server: wire format, routes and process lifecycle.

Its modules, each importing only from those above it (no cycles, function-level imports
counted):

- ``statuses``: THE table of statuses by name (``Status``), what gRPC, ``/metrics`` and
  OpenAI call each; ``HTTPError``; pure.
- ``tensors``: the tensor codecs (binary layouts, JSON data lists); pure.
- ``messages``: the request and response records, ``ProtocolError``, and the checks every
  decoder shares (duplicate names, shared memory, classification, the element limit); pure.
- ``rest_codec``: REST's v2 bodies to records and back; pure.
- ``admission``: a request checked against its model, the model's outputs shaped; pure.
- ``statistics``: Triton's statistics extension: durations, the compute phases (per batch
  size too) and response-cache counts, from a batcher's stats; pure.
- ``registry``: the served models, their batchers, metadata, config, statistics, and
  readiness (``ready``, ``is_ready``, ``model_ready``, the ready-only index).
- ``outcomes``: ``error_status``, the one classification of exceptions into statuses.
- ``inference``: THE inference path, one request's life for every protocol: ready, decode,
  admit, batch (withdrawn on disconnect, cancel or deadline), respond, encode, record, time.
- ``grpc_codec``: Triton's gRPC messages (tritonclient's stubs) to those records and back; pure.
- ``openai``: OpenAI's embeddings and models bodies to and from those records; pure.
- ``openapi``: the OpenAPI 3 document of the REST routes, served at ``/v2/openapi.json``; pure.
- ``auth``: API keys: which a request presents, constant-time checks, the open routes; pure.
- ``asgi`` / ``bodies``: ASGI plumbing (and the connection's watch of each request);
  request bodies within the size limit and body timeout.
- ``connections``: uvicorn's HTTP protocol with a header-read timeout, a JSON 503 past
  ``--limit-concurrency``, and each request's watch (body complete, client gone).
- ``buckets`` / ``metrics``: ``/metrics`` histogram buckets (pure); Prometheus exposition.
- ``grpc_access``: the gRPC API-key interceptor and its port, with TLS or without.
- ``logs``: one log handler and format for every logger, and the access log, written once
  per event-loop turn.
- ``bursts``: gRPC inference calls held back while more arrive, let go together, so that
  they reach the batcher together as REST's do.
- ``grpc_service``: the gRPC front end: decodes and encodes, on the inference path it is
  given, on the app's loop (its inference calls through ``bursts``); never imports the app.
- ``app``: the ASGI application: lifespan, routes, the REST front ends (v2 and OpenAI) of
  the inference path; starts and drains the gRPC server it is given.
- ``links``: a front-end process's link to the main one: framed ops over a Unix socket,
  their arrays through shared memory, one frame of arrays in flight each way.
- ``zygote``: the single-threaded process, forked at the start, that forks the front ends.
- ``tallies``: ``--frontends N``: every front end's counts of its answers, in memory shared
  with the main process (a slot per front end, that outlives it), summed there.
- ``hub`` / ``remote``: ``--frontends N``: the main process's end (requests into the one
  batcher per model, answers back, every front end's counts summed) and a front end's
  (``FrontEndRegistry``, whose batchers are ``RemoteBatcher``, the main's over the link).
- ``spread``: the main process with front ends: hold the ports, start the batchers, fork,
  replace a front end that dies, drain them all on a signal.
- ``config`` / ``serve``: the process's settings; wiring (registry -> inference path -> app,
  and the gRPC server only when its port is on); bind, serve, drain on a signal; with
  ``--frontends N``, the main process (``spread``) and each front end's server.

A request's walk goes one way: front end (``app`` or ``grpc_service``) -> ``inference``
(-> ``registry``, the decoder it was given: ``rest_codec`` / ``openai`` / ``grpc_codec``,
``admission``, the batcher, ``admission``, the encoder, ``outcomes``) -> front end. With
front-end processes, "the batcher" is a ``RemoteBatcher``: the admitted inputs cross the
link to the main process's batcher and the outputs come back (``remote`` -> ``links`` ->
``hub``).
"""
