"""Configuration: gin and absl flags (`gin_utils`), gin files read beside a
live configuration (`gin_reader`)."""
