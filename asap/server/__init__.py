"""`asap serve`: an OpenAI-compatible HTTP server for prefill, with KV hand-off. See README.md here."""
