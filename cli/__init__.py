"""The trainscout command line.

`trainscout.cli.__version__` is the installed distribution's version. `trainscout` itself is a namespace package
(pyproject's package-dir assembles it from the top-level folders; it has no __init__.py), so it can carry no
`__version__` of its own."""
from importlib.metadata import PackageNotFoundError, version as _installed

try:
    __version__ = _installed("trainscout")
except PackageNotFoundError:  # the folders imported without an install: the name trainscout.cli needs one anyway
    __version__ = "unknown"
