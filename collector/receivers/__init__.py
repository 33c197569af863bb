"""OTLP receivers: gRPC and HTTP (protobuf and JSON) for traces and metrics."""
