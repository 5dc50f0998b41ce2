"""The trainscout command line (`trainscout`: cli/main.py, the commands by job beside it). `trainscout.cli.__version__`
is `trainscout.__version__`, the installed distribution's version."""
from trainscout import __version__  # noqa: F401
