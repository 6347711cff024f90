"""Typed schemas of the workloads, one module per workload.

Each module defines a dataclass extending `stratacl.config.WorkloadConfig` and stores it in
Hydra's ConfigStore as `workload/<name>_schema`; `conf/workload/<name>.yaml` lists that schema
first in its defaults so wrong types fail at compose time. Importing this package registers all.
"""

import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
