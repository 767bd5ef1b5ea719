"""Private machinery of the sandbox backends and the verifier (overlay layers, cgroups, processes)."""
