"""The ext_proc edge: the only place that touches Envoy's protobuf classes."""
