"""Print the project's dependencies (and its test extra) except torch, one per line.

The torchvision environment (``make test-torchvision``) pins its own ``torch==2.14.1`` to match
``torchvision==0.29.1``; installing the project with its dependencies would replace that torch with
the range the main environment needs, so that environment installs the project with ``--no-deps``
and these requirements beside it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
    if re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0] != "torch":
        print(requirement)
