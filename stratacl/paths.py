"""Where the Hydra configs live: `conf/` beside the packages in a checkout or an editable install;
in a regular (non-editable) install, the copy pyproject.toml ships as data files under
`<prefix>/share/stratacl-harness/conf`."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[1] / "conf"
_SHARE = Path("share") / "stratacl-harness" / "conf"


def _conf_dir() -> Path:
    candidates = [_CHECKOUT, Path(sysconfig.get_path("data")) / _SHARE, Path(sys.prefix) / _SHARE]
    return next((p for p in candidates if (p / "config.yaml").is_file()), _CHECKOUT)


CONF = _conf_dir()
