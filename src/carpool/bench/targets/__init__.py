"""What carpool bench drives: v2 over HTTP or gRPC, OpenAI, a model in process."""
