"""The gRPC boundary: translation between protos and the domain, and the one
table that maps domain errors to gRPC statuses. No rules live here."""
