"""mathkit: small number helpers."""
