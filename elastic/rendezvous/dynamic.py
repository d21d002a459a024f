"""Former name of :mod:`elastic.rendezvous.dynamic_rendezvous` (torch's module name).

Kept so that code written against the earlier name keeps importing; new code should
import from ``elastic.rendezvous.dynamic_rendezvous``.
"""

from elastic.rendezvous.dynamic_rendezvous import *  # noqa: F403
from elastic.rendezvous.dynamic_rendezvous import __all__ as __all__
