"""trainscout: the fastest way to pre-train a model on the GPUs you have, measured honestly.

The subpackages live in the repository's top-level folders (pyproject's package-dir): trainscout.spaces (spaces/),
trainscout.trial (trial/), trainscout.search (search/), trainscout.analysis (analysis/), trainscout.runtime
(runtime/), trainscout.store (store/), trainscout.cli (cli/). This package holds only the version."""
from importlib.metadata import PackageNotFoundError, version as _installed

try:
    __version__ = _installed("trainscout")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "unknown"
