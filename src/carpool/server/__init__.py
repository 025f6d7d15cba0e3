"""The KServe v2 / Triton server (REST, gRPC, OpenAI embeddings): a package per concern."""
