"""The gRPC front end: Triton's service, its messages, access keys, bursts."""
