"""The adaptive policy: a latency model learned online per deployment (see docs/adaptive.md)."""
