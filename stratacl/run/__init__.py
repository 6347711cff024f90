"""The CLI (`python -m stratacl.run`): compose-time checks, run directories, sweeps."""
