"""trainscout: the fastest way to pre-train a model on the GPUs you have, measured honestly.

The subpackages live in the repository's top-level folders (pyproject's package-dir): trainscout.spaces (spaces/),
trainscout.trial (trial/), trainscout.predictor (predictor/), trainscout.search (search/), trainscout.analysis
(analysis/), trainscout.runtime (runtime/), trainscout.store (store/), trainscout.atlas (atlas/), trainscout.cli
(cli/). This package holds only the version."""
from importlib.metadata import PackageNotFoundError, version as _installed

try:
    __version__ = _installed("trainscout")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "unknown"


def _quiet_library_noise() -> None:
    """Library lines that say nothing about the user's run, dropped where they are logged, by their exact text (any
    other record of these loggers passes): torchao's import tries its GPU kernel libraries (_C_mxfp8, _C_cutlass_*),
    which a CPU or non-Blackwell build lacks ("Failed to load .../torchao/_C_mxfp8...so: Could not load this
    library"), and torch's pytree warns that torchao registers two of its Enums (KernelPreference,
    ScaleCalculationMode) as constants ("... is an Enum subclass and is now natively supported by torch.compile ...
    deprecated"). Installed on the loggers when trainscout is imported (this process, and each Ray worker, which
    imports trainscout before torchao); imports neither torch nor torchao."""
    import logging
    import re

    torchao_libs = re.compile(r"^Failed to load \S*torchao[/\\]_C_(mxfp8|cutlass)\S*: ")
    enums = {"KernelPreference", "ScaleCalculationMode"}

    class Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.name == "torchao":
                return not torchao_libs.match(record.getMessage())
            if record.name == "torch.utils._pytree" and str(record.msg).startswith(
                    "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type. "
                    "Calling register_constant() on Enum subclasses is deprecated"):
                return getattr(record.args[0] if record.args else None, "__name__", None) not in enums
            return True
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).addFilter(Drop())


_quiet_library_noise()
