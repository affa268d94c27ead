"""Pool manifests, their renderers, and the vLLM emulator."""
