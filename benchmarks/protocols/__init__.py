"""The protocols group: what each way in (REST JSON/binary, gRPC) costs, against plain references."""
