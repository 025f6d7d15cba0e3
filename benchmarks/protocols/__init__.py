"""The protocols group: what each way in (REST JSON/binary, gRPC) costs, beside references."""
