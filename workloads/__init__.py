"""Workload packages, one per workload (`workloads/<name>/`, exporting `SPEC`): the registry
(stratacl/workload_registry.py) finds every subpackage here, and installed distributions that
declare one under the `stratacl.workloads` entry-point group."""
