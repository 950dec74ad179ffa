"""PII detection and redaction: presidio recognizers, the engine, and the streaming redactor."""
