"""The REST front end: ASGI app, v2 JSON and binary bodies, connections, OpenAPI."""
