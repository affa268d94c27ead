"""specgate: route each OpenAI request to the speculative or the standard vLLM pool."""

__version__ = "0.1.0"
