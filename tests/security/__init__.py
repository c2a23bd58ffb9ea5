"""Security: credentials, TLS, per-node broker access, rate limits, fuzzed parsers."""
