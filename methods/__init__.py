"""Token-targeting methods. Importing this package registers the built-in ones."""

from methods import uniform  # noqa: F401
from methods import d3s  # noqa: F401
from methods import nat  # noqa: F401
from methods import entropy  # noqa: F401
from methods import gmts  # noqa: F401
from methods import rsi  # noqa: F401
from methods import ktae  # noqa: F401
