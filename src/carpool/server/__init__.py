"""The KServe v2 / Open Inference Protocol server: wire format, routes and process lifecycle."""
