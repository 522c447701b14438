"""Hardware: the GPU catalog, the topology probe and the environment snapshot."""
