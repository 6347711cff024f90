"""Workload packages, one per workload (`workloads/<name>/`, exporting `SPEC`).

A namespace any directory on `sys.path` may add packages to: a user's own workload is a package
`workloads/<name>/` in their tree (stratacl/workload_registry.py finds it like the bundled ones).
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
