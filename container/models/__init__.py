"""Model management: configs, sources on disk, the registry and the memory-aware cache."""
